"""`tether view`: a web page for a run, from the run's topics projected into a ClickHouse store (chdb by default)."""
