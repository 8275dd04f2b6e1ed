"""The pieces of tools/measure_gpu.py: how device time is taken (timing), and the tables
(compute_tables, transfer_tables, contention_tables), each a function (timer, config, tables)."""
