"""Tool executors: one per tool family; the only processes that call providers, each call keyed and receipted."""
