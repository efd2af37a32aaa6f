"""Everything rocmfix shows, one module per command family; nothing else prints."""
