"""The event contract every Tether service shares: Avro events, the topic catalogue, and bus helpers.

Services meet only here and on the wire; domain code sees event classes, never bytes.
"""
