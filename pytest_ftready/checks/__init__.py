"""The checks, one module per area, each a set of short functions registered with
``@check`` (registry) that ask the session for facts and judge them, raising ``Fail`` or
``Skip`` from ``outcomes``.

A check module imports the registry, the session's facts through ``ctx``, and the layers
below; never another check module and never pytest. Only the registry and the pytest face
import check modules."""
