"""The data path: training rows read with their provenance (rows), encoded into
input_ids/labels exactly as training sees them and verified (encoding), scanned for secrets
and personal data (scan, audit), and pinned by a manifest (manifest).

Imports the recipe and the foundation modules (outcomes, units, files); never the engine,
the session, the checks or pytest. torch is never imported here."""
