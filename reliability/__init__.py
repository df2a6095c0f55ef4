"""The reliability suite: chaos, fuzz and soak runs against the real system, each writing its section of
RELIABILITY.md (``make chaos``, ``make fuzz``, ``make soak``; short forms run in the test suite)."""
