"""Activities: all I/O, one class per external system, clients injected in `__init__`."""
