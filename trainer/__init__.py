"""The collocated trainer and the embedded inference engine it shares weights with (issues 3 and 7)."""
