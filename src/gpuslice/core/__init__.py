"""Pure domain logic: no I/O, clocks, threads or third-party imports."""
