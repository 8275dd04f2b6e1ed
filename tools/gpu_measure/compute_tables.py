"""Kernel tables: GEMMs, grouped GEMMs, attention and memory-bound kernels."""

import sys

import torch

from .timing import MeasureError, calls_for, fits, fmt


def gemm_tables(t, cfg, tables):
    dt = cfg.dtype
    dev = cfg.device
    rows = []
    grid = cfg.gemm_grid
    for layout, (ms, ns, ks) in grid.items():
        for m in ms:
            for n in ns:
                for k in ks:
                    if not fits(2 * 2 * (m * k + n * k + m * n), cfg):
                        continue
                    # Two input sets, so that consecutive calls do not hit in L2 alone.
                    if layout == "NT":  # X[m,k] . W[n,k]^T: a linear layer's forward
                        sets = [(torch.randn(m, k, dtype=dt, device=dev),
                                 torch.randn(n, k, dtype=dt, device=dev)) for _ in range(2)]
                        call = lambda i, s=sets: torch.mm(s[i % 2][0], s[i % 2][1].t())
                    elif layout == "NN":  # dY[m,k] . W[k,n]: its dgrad
                        sets = [(torch.randn(m, k, dtype=dt, device=dev),
                                 torch.randn(k, n, dtype=dt, device=dev)) for _ in range(2)]
                        call = lambda i, s=sets: torch.mm(s[i % 2][0], s[i % 2][1])
                    else:  # TN: dY[k,m]^T . X[k,n]: its wgrad
                        sets = [(torch.randn(k, m, dtype=dt, device=dev),
                                 torch.randn(k, n, dtype=dt, device=dev)) for _ in range(2)]
                        call = lambda i, s=sets: torch.mm(s[i % 2][0].t(), s[i % 2][1])
                    guess = 2.0 * m * n * k / cfg.peak_flops
                    s = t.graph(call, calls_for(guess))
                    rows.append([layout, m, n, k, fmt(s), "%.4g" % (2.0 * m * n * k / s / 1e12)])
                    del sets
    tables.write("gemm_bf16.csv", ["layout", "m", "n", "k", "seconds", "tflops"], rows)

    rows = []
    for m, n, k in cfg.fp32_shapes:
        a = torch.randn(m, k, dtype=torch.float32, device=dev)
        b = torch.randn(n, k, dtype=torch.float32, device=dev)
        s = t.events(lambda: torch.mm(a, b.t()))
        rows.append(["float32", m, n, k, fmt(s), "%.4g" % (2.0 * m * n * k / s / 1e12), "events"])
    tables.write("gemm_other.csv", ["dtype", "m", "n", "k", "seconds", "tflops", "timing"], rows)


def grouped_kernel(device):
    """What times the experts' forward here: torch._grouped_mm (CUTLASS, Hopper and later) where
    PyTorch has it for this GPU, else a loop of GEMMs (Megatron's SequentialMLP). device.json
    records it, and `nodeemu calibrate` reads the table's tiling from it."""
    # PyTorch's GroupMM.cu has CUTLASS kernels for sm90 and sm100 only; elsewhere _grouped_mm
    # falls back to a loop of its own, which is not the kernel device.json would name.
    if device == "cuda" and hasattr(torch, "_grouped_mm") and \
            torch.cuda.get_device_capability()[0] in (9, 10):
        return "torch._grouped_mm"
    return "loop_mm"


class GroupSplit:
    """Rows per expert, with the device offsets torch._grouped_mm takes made once, up front:
    making a device tensor from host data inside a CUDA-graph capture is illegal."""

    def __init__(self, rows, device):
        self.rows = rows
        self.offs = None
        if grouped_kernel(device) == "torch._grouped_mm":
            self.offs = torch.cumsum(torch.tensor(rows, dtype=torch.int32, device=device), 0,
                                     dtype=torch.int32)


def grouped_mm(x, w, split):
    """The experts' forward: one grouped kernel where PyTorch has one, else a loop of GEMMs."""
    if split.offs is not None:
        return torch._grouped_mm(x, w, offs=split.offs)
    return loop_mm(x, w, split)


def loop_mm(x, w, split):
    out, at = [], 0
    for g, r in enumerate(split.rows):
        out.append(torch.mm(x[at:at + r], w[g]))
        at += r
    return torch.cat(out)


def grouped_tables(t, cfg, tables):
    dt, dev = cfg.dtype, cfg.device
    rows = []
    for shape, n, k in cfg.grouped_families:
        for g in cfg.grouped_groups:
            for r in cfg.grouped_rows:
                total = g * r
                if not fits(2 * (2 * g * k * n + 2 * total * (k + n)), cfg):
                    continue
                # Weights [k, n] per expert, stored column-major (as torch._grouped_mm's 2d x 3d
                # form takes them): a transposed view of [g, n, k].
                sets = [(torch.randn(total, k, dtype=dt, device=dev),
                         torch.randn(g, n, k, dtype=dt, device=dev).transpose(-2, -1))
                        for _ in range(2)]
                split = GroupSplit([r] * g, dev)
                call = lambda i, s=sets, sp=split: grouped_mm(s[i % 2][0], s[i % 2][1], sp)
                try:
                    s = t.graph(call, calls_for(2.0 * total * n * k / cfg.peak_flops))
                except RuntimeError as e:  # a shape the kernel does not take: no row
                    print("skipped grouped %s g=%d r=%d: %s" % (shape, g, r, e), file=sys.stderr)
                    continue
                rows.append([shape, g, r, n, k, fmt(s), "%.4g" % (2.0 * total * n * k / s / 1e12)])
                del sets
    tables.write("grouped_gemm_bf16.csv",
                 ["shape", "groups", "rows_per_group", "n", "k", "seconds", "tflops"], rows)

    rows = []
    for g, r, n, k in cfg.loop_shapes:
        x = torch.randn(g * r, k, dtype=dt, device=dev)
        w = torch.randn(g, n, k, dtype=dt, device=dev).transpose(-2, -1)
        split = GroupSplit([r] * g, dev)
        impls = [("loop_mm", loop_mm)]
        if split.offs is not None:  # no grouped kernel here: only the loop is what it says
            impls.insert(0, ("torch._grouped_mm", grouped_mm))
        for impl, fn in impls:
            s = t.graph(lambda i, f=fn: f(x, w, split), 2)
            rows.append([impl, g, r, n, k, fmt(s), "%.4g" % (2.0 * g * r * n * k / s / 1e12)])
    tables.write("grouped_gemm_vs_loop.csv",
                 ["impl", "groups", "rows_per_group", "n", "k", "seconds", "tflops"], rows)


def attention(q, k, v, backend):
    """Causal attention through SDPA with the asked backend, or the math where there is none."""
    if q.is_cuda and hasattr(torch.nn, "attention"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kind = SDPBackend.CUDNN_ATTENTION if backend == "cudnn" else SDPBackend.FLASH_ATTENTION
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(kind):
            if q.shape[1] == k.shape[1]:
                return sdpa(q, k, v, is_causal=True)
            try:
                return sdpa(q, k, v, is_causal=True, enable_gqa=True)
            except (RuntimeError, TypeError):
                # A backend (or PyTorch) without native GQA: K and V repeated to the query heads,
                # as Transformer Engine does for such backends.
                rep = q.shape[1] // k.shape[1]
                return sdpa(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1),
                            is_causal=True)
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = q.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)


def attention_forward_backward(q, k, v, grad, backend):
    out = attention(q, k, v, backend)
    return torch.autograd.grad(out, (q, k, v), grad)


def attention_backward(t, cfg, sets, fwd, flops, backend):
    """The backward's device time. `graph` (the default): the forward and backward replayed
    together from a CUDA graph, less the graph-replayed forward, so that autograd's host time is
    not in it (NodeEmu charges the host separately). `events`: the calibration README's method,
    autograd's eager backward timed with events over 3 calls, whose short sequences carry
    150-400 us of host time on the H100 box."""
    def eager():
        q, k, v = (x.clone().requires_grad_(True) for x in sets[0])
        out = attention(q, k, v, backend)
        grad = torch.randn_like(out)
        return t.events(lambda: [out.backward(grad, retain_graph=True) for _ in range(3)]) / 3

    if cfg.attention_backward == "events":
        return eager()
    leaves = [tuple(x.clone().requires_grad_(True) for x in s) for s in sets]
    grads = [torch.randn(s[0].shape[:-1] + (s[2].shape[-1],), dtype=s[0].dtype,
                         device=s[0].device) for s in sets]
    try:
        both = t.graph(lambda i: attention_forward_backward(*leaves[i % 2], grads[i % 2], backend),
                       calls_for(3.5 * flops / cfg.peak_flops))
    except RuntimeError as e:
        # A backward this PyTorch cannot capture: the README's method for this row, recorded in
        # device.json so that the row is not mistaken for device time.
        where = "%s h%d/%d d%d/%d seq %d" % (backend, sets[0][0].shape[1], sets[0][1].shape[1],
                                            sets[0][0].shape[-1], sets[0][2].shape[-1],
                                            sets[0][0].shape[2])
        print("attention backward %s: not capturable (%s); timed with events" % (where, e),
              file=sys.stderr)
        cfg.event_timed_backward.append(where)
        return eager()
    if both <= fwd:
        if cfg.device == "cuda":
            raise MeasureError("attention %s: forward+backward (%.3g s) not longer than the "
                               "forward (%.3g s); repeat with more --repeats" % (backend, both, fwd))
        return both  # the CPU stand-in's wall clock: a pipeline check, not a measurement
    return both - fwd


def attention_table(t, cfg, tables):
    dt, dev = cfg.dtype, cfg.device
    rows = []
    for backend in ("cudnn", "flash"):
        for shape, hq, hkv, dqk, dv in cfg.attention_shapes:
            for seq in cfg.attention_seqs:
                # q, k, v and the output with their gradients; the CPU's math keeps the scores
                need = 2 * 2 * 3 * seq * (hq + hkv) * (dqk + dv)
                if dev != "cuda":
                    need += 3 * 4 * hq * seq * seq
                if not fits(need, cfg):
                    continue
                try:
                    sets = [(torch.randn(1, hq, seq, dqk, dtype=dt, device=dev),
                             torch.randn(1, hkv, seq, dqk, dtype=dt, device=dev),
                             torch.randn(1, hkv, seq, dv, dtype=dt, device=dev))
                            for _ in range(2)]
                    flops = 2.0 * hq * seq * seq * (dqk + dv) * 0.5
                    fwd = t.graph(lambda i, s=sets, b=backend: attention(*s[i % 2], b),
                                  calls_for(flops / cfg.peak_flops))
                    bwd = attention_backward(t, cfg, sets, fwd, flops, backend)
                except RuntimeError as e:  # a backend that does not take this shape: no row
                    print("skipped attention %s %s seq %d: %s" % (backend, shape, seq, e),
                          file=sys.stderr)
                    continue
                rows.append([backend, shape, hq, hkv, dqk, dv, seq, 1, fmt(fwd), fmt(bwd),
                             "%.4g" % (flops / fwd / 1e12), "%.4g" % (2.5 * flops / bwd / 1e12)])
    tables.write("attention_bf16.csv",
                 ["backend", "shape", "q_heads", "kv_heads", "d_qk", "d_v", "seq", "causal",
                  "fwd_seconds", "bwd_seconds", "fwd_tflops", "bwd_tflops"], rows)


def rmsnorm(x, w):
    if hasattr(torch.nn.functional, "rms_norm"):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


# The kernels of Megatron's unfused paths that run far below bytes over bandwidth (the layer
# anatomy, shared/calibration/h100_layer_anatomy): a row gather's backward and the unfused
# unpermute (index_add with atomics, bf16 and fp32, at two row widths), RoPE and SwiGLU on
# strided views, and the permute's bookkeeping (moe_utils.permute's masked_select over the
# routing map, argsort, cumsum) and the alltoall dispatcher's chunk sort (torch.cat of chunks).
# `index_add_bf16_h2048` and `strided_elementwise_bf16` price NodeEmu's scatter_add and strided
# classes (`nodeemu calibrate` maps them); the rest are recorded for the kernels NodeEmu prices
# as elementwise or copies today.
UNFUSED_SERIES = ["index_add_bf16_h2048", "index_add_bf16_h7168", "index_add_f32_h2048",
                  "strided_elementwise_bf16", "cat_64_chunks_bf16", "masked_select_top8_of128",
                  "argsort_top8", "cumsum_i64"]


def unfused_path_rows(t, cfg):
    dt, dev = cfg.dtype, cfg.device
    rows = []
    topk, experts = 8, 128

    def add(op, tokens, b, s):
        rows.append([op, tokens, b, fmt(s), "%.4g" % (b / s / 1e9) if b != "" else ""])

    for tokens in cfg.token_counts:
        # index_add: top-k rows per token summed back into the tokens; bytes = rows read + output.
        for op, h, dtype in (("index_add_bf16_h2048", 2048, dt), ("index_add_bf16_h7168", 7168, dt),
                             ("index_add_f32_h2048", 2048, torch.float32)):
            size = dtype.itemsize if hasattr(dtype, "itemsize") else torch.finfo(dtype).bits // 8
            if not fits(2 * tokens * (topk + 1) * h * size, cfg):
                continue
            out = torch.zeros(tokens, h, dtype=dtype, device=dev)
            src = [torch.randn(tokens * topk, h, dtype=dtype, device=dev) for _ in range(2)]
            idx = torch.randint(0, tokens, (tokens * topk,), device=dev)
            b = (tokens * topk + tokens) * h * size
            s = t.graph(lambda i, o=out, x=src, j=idx: o.index_add_(0, j, x[i % 2]),
                        calls_for(b / 1e11))
            add(op, "", b, s)
        # RoPE's x * cos on the heads' transposed view of a [tokens, heads * 128] projection.
        q = [torch.randn(tokens, 32 * 128, dtype=dt, device=dev) for _ in range(2)]
        cos = torch.randn(1, 1, tokens, 128, dtype=dt, device=dev)
        b = 2 * q[0].numel() * 2 + cos.numel() * 2
        s = t.graph(lambda i: q[i % 2].view(tokens, 32, 128).transpose(0, 1)[None] * cos,
                    calls_for(b / 1e12))
        add("strided_elementwise_bf16", "", b, s)
        # sort_chunks_by_idxs: the received rows cut into 64 chunks (8 experts x EP 8) and cat.
        rows_in = tokens * topk
        x = [torch.randn(rows_in, 2048, dtype=dt, device=dev) for _ in range(2)]
        b = 2 * x[0].numel() * 2
        if fits(3 * b, cfg):
            chunks = [list(xi.chunk(64)) for xi in x]
            s = t.graph(lambda i: torch.cat(chunks[i % 2][::-1]), calls_for(b / 1e12))
            add("cat_64_chunks_bf16", "", b, s)
        # moe_utils.permute without fusion: the token indices the routing map selects.
        routing = [torch.rand(experts, tokens, device=dev) < topk / experts for _ in range(2)]
        ids = torch.arange(tokens, device=dev).unsqueeze(0).expand(experts, -1)
        # Its output's size is the host's to know (a sync inside): not capturable, so timed with
        # events, the host's wait included, as a real step pays it.
        s = t.events(lambda: ids.masked_select(routing[0]))
        add("masked_select_top8_of128", tokens, "", s)
        keys = [torch.randint(0, experts, (tokens * topk,), device=dev) for _ in range(2)]
        s = t.graph(lambda i: torch.argsort(keys[i % 2], stable=True), calls_for(tokens / 1e9))
        add("argsort_top8", tokens, "", s)
        s = t.graph(lambda i: torch.cumsum(keys[i % 2], 0), calls_for(tokens / 1e10))
        add("cumsum_i64", tokens, "", s)
    return rows


def memory_table(t, cfg, tables):
    # The RMSNorm, SwiGLU and router rows are eager PyTorch's kernels (SwiGLU is two: silu, then
    # the product), not Transformer Engine's fused ones: a lower bound on what a fused kernel
    # saves, and the same method as the shipped H100 tables.
    dt, dev = cfg.dtype, cfg.device
    rows = []
    for size in cfg.copy_bytes:
        if not fits(4 * size, cfg):
            continue
        n = size // 2
        sets = [(torch.empty(n, dtype=dt, device=dev), torch.randn(n, dtype=dt, device=dev))
                for _ in range(2)]
        s = t.graph(lambda i, s=sets: s[i % 2][0].copy_(s[i % 2][1]), calls_for(size / 1e12))
        rows.append(["d2d_copy", "", 2 * size, fmt(s), "%.4g" % (2 * size / s / 1e9)])
        s = t.graph(lambda i, s=sets: torch.add(s[i % 2][1], 1.0), calls_for(size / 1e12))
        rows.append(["elementwise_add_scalar", "", 2 * size, fmt(s), "%.4g" % (2 * size / s / 1e9)])
    h, topk, ffn, experts = 2048, 8, 768, 128
    for tokens in cfg.token_counts:
        x = [torch.randn(tokens, h, dtype=dt, device=dev) for _ in range(2)]
        w = torch.ones(h, dtype=dt, device=dev)
        s = t.graph(lambda i: rmsnorm(x[i % 2], w), calls_for(tokens * h * 4 / 1e12))
        b = 2 * tokens * h * 2
        rows.append(["rmsnorm_h2048", tokens, b, fmt(s), "%.4g" % (b / s / 1e9)])
        idx = torch.randint(0, tokens, (tokens * topk,), device=dev)
        s = t.graph(lambda i: x[i % 2].index_select(0, idx), calls_for(tokens * topk * h * 4 / 1e12))
        b = 2 * tokens * topk * h * 2
        rows.append(["permute_gather_top8_h2048", tokens, b, fmt(s), "%.4g" % (b / s / 1e9)])
        a = [torch.randn(tokens * topk, 2 * ffn, dtype=dt, device=dev) for _ in range(2)]
        s = t.graph(lambda i: torch.nn.functional.silu(a[i % 2][:, :ffn]) * a[i % 2][:, ffn:],
                    calls_for(tokens * topk * ffn * 6 / 1e12))
        rows.append(["swiglu_768_top8", tokens, tokens * topk * 3 * ffn * 2, fmt(s), ""])
        logits = [torch.randn(tokens, experts, dtype=torch.float32, device=dev) for _ in range(2)]
        s = t.graph(lambda i: torch.topk(torch.softmax(logits[i % 2], dim=-1), topk, dim=-1),
                    calls_for(tokens * experts * 8 / 1e12))
        rows.append(["router_softmax_top8_of128", tokens, "", fmt(s), ""])
    rows += unfused_path_rows(t, cfg)
    # One series after another, each in increasing size (NodeEmu checks the order).
    order = ["d2d_copy", "elementwise_add_scalar", "rmsnorm_h2048", "permute_gather_top8_h2048",
             "swiglu_768_top8", "router_softmax_top8_of128"] + UNFUSED_SERIES
    rows.sort(key=lambda r: order.index(r[0]))
    tables.write("memory_bound.csv", ["op", "tokens", "bytes_moved", "seconds", "gb_s"], rows)
