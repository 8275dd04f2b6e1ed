"""Copy and host-cost tables: PCIe copies (events and graphs, both directions at once) and the
host's cost of launches, events, waits and syncs."""

import time

import torch

from .timing import fits, fmt


def host_buffer(n, pinned, cfg):
    b = torch.empty(n, dtype=torch.uint8)
    return b.pin_memory() if pinned and cfg.device == "cuda" else b


def pcie_table(t, cfg, tables):
    dev = cfg.device
    rows = []
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            for size in cfg.pcie_bytes:
                if not fits(2 * size, cfg):
                    continue
                host = host_buffer(size, memory == "pinned", cfg)
                gpu = torch.empty(size, dtype=torch.uint8, device=dev)
                if direction == "h2d":
                    s = t.events(lambda: gpu.copy_(host, non_blocking=memory == "pinned"))
                else:
                    s = t.events(lambda: host.copy_(gpu, non_blocking=memory == "pinned"))
                rows.append([direction, memory, size, fmt(s), "%.4g" % (size / s / 1e9), "events"])
    for direction in ("h2d", "d2h"):
        for size in cfg.pcie_graph_bytes:
            hosts = [host_buffer(size, True, cfg) for _ in range(2)]
            gpus = [torch.empty(size, dtype=torch.uint8, device=dev) for _ in range(2)]
            if direction == "h2d":
                call = lambda i: gpus[i % 2].copy_(hosts[i % 2], non_blocking=True)
            else:
                call = lambda i: hosts[i % 2].copy_(gpus[i % 2], non_blocking=True)
            s = t.graph(call, 8)
            rows.append([direction, "pinned", size, fmt(s), "%.4g" % (size / s / 1e9), "graph"])
    # Both directions at once: half the bytes each way on two streams.
    size = cfg.concurrent_bytes
    half = size // 2
    hin, hout = host_buffer(half, True, cfg), host_buffer(half, True, cfg)
    gin, gout = (torch.empty(half, dtype=torch.uint8, device=dev) for _ in range(2))
    if cfg.device == "cuda":
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

        def both():
            with torch.cuda.stream(s1):
                gin.copy_(hin, non_blocking=True)
            with torch.cuda.stream(s2):
                hout.copy_(gout, non_blocking=True)
            torch.cuda.current_stream().wait_stream(s1)
            torch.cuda.current_stream().wait_stream(s2)
    else:
        def both():
            gin.copy_(hin)
            hout.copy_(gout)
    s = t.events(both)
    rows.append(["h2d+d2h_concurrent", "pinned", size, fmt(s), "%.4g" % (size / s / 1e9), "events"])
    tables.write("pcie.csv", ["direction", "host_memory", "bytes", "seconds", "gb_s", "timing"],
                 rows)


def host_cost_table(t, cfg, tables):
    dev = cfg.device
    x = torch.zeros(16, device=dev)
    n = cfg.host_calls
    rows = [["torch_add_host_per_launch", fmt(t.host(lambda: x.add_(1), n), 3)]]
    rows.append(["torch_add_device_per_kernel_backtoback",
                 fmt(t.events(lambda: [x.add_(1) for _ in range(n)]) / n, 3)])
    if cfg.device == "cuda":
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        rows.append(["graph_replay_per_kernel", fmt(t.host(g.replay, 1) / n, 3)])
        ev = torch.cuda.Event()
        rows.append(["event_record_host", fmt(t.host(ev.record, n), 3)])
        stream = torch.cuda.current_stream()
        rows.append(["stream_wait_event_host", fmt(t.host(lambda: stream.wait_event(ev), n), 3)])
        sync = torch.cuda.synchronize
    else:
        # No graphs, events or streams on the CPU: the nearest Python-level calls stand in.
        rows.append(["graph_replay_per_kernel", fmt(t.host(lambda: None, n), 3)])
        rows.append(["event_record_host", fmt(t.host(lambda: time.perf_counter(), n), 3)])
        rows.append(["stream_wait_event_host", fmt(t.host(lambda: None, n), 3)])
        sync = lambda: None

    def roundtrip():
        x.add_(1)
        sync()
    rows.append(["launch_plus_sync_roundtrip", fmt(t.host(roundtrip, n), 3)])
    rows.append(["sync_idle", fmt(t.host(sync, n), 3)])
    counts = torch.zeros(128, dtype=torch.int64, device=dev)
    rows.append(["small_d2h_host_sync_128_int64", fmt(t.host(counts.tolist, n), 3)])
    tables.write("host_costs.csv", ["what", "seconds"], rows)
