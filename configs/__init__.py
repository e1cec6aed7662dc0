"""Config files: one paper row (or CPU setting) per file, `get_config(arg)`; shared blocks in
`common.py`."""
