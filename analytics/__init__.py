"""Analytics: the events as ClickHouse tables, and the two ways people read them.

- `sink.py`: events → rows of `clickhouse/schema.sql`, written in batches (the processors' sink agent runs it, so the
  tables follow the same consumer offsets as the training data).
- `clickhouse/`: the tables and the named queries.
- `report.py`: `tether analytics`, the queries for one run printed and plotted.
- `view/`: `tether view`, its own process with its own consumer and store: a run in a browser.
"""
