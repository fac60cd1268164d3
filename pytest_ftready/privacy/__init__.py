"""Privacy: secrets and personal data found in training data and artifacts, and kept out of
every output; the model's license, file access and backups.

- ``scan``: one text's findings (patterns, then validators), each with a fingerprint and a
  redacted preview, never the value;
- ``prefilter``: the lines of a file that can hold a finding, found over the raw bytes;
- ``redaction``: values redacted across the pieces a text is cut into (tokens, mask runs);
- ``audit``: the privacy checks' plain logic: files scanned (in worker processes), the model's
  license, effective file access, whether backups look encrypted.

``scan``, ``prefilter`` and ``redaction`` import nothing of the package (the data path and the
outputs' gate use them); ``audit`` reads files through the data path (``data.rows``,
``data.passes``). Never the engine, the session, the checks or pytest; torch is never imported here."""
