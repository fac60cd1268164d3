"""Check modules, one per area. Each registers its checks with ``@check``."""
