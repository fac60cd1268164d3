"""The ``scale`` benchmarks (large generated corpora, minutes) and the ``published`` ones (the
memory forecast against published measured peaks) run only when asked for: ``pytest tests -m
scale`` or ``-m published``; a plain ``pytest tests`` deselects them (``tests/conftest.py``)."""
