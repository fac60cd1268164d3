"""The outputs: measurements as data and the writers that format them (the terminal
summary, JSON payloads for JUnit and pytest-benchmark, the human report with its charts).

Formats what it is given; computes no figure and imports nothing above it (no session,
engine, checks or pytest)."""
