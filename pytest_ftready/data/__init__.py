"""The data path: training rows read with their provenance (rows), encoded into
input_ids/labels exactly as training sees them and verified (encoding, with its speed-ups in
fast_encoding), and pinned by a manifest (manifest). Scanning for secrets and personal data
is the ``privacy`` package's.

Imports the recipe, ``privacy``'s scan and redaction, and the foundation modules (outcomes,
units, files); never the engine, the session, the checks or pytest. torch is never imported here."""
