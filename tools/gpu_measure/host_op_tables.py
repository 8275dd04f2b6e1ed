"""host_ops.csv: what the framework costs the host per operation, beyond a bare launch.

A real layer is issued by Python, the dispatcher and autograd: tens of microseconds per operation
(shared/calibration/h100_layer_anatomy), where host_costs.csv's bare `x.add_(1)` is a few. Four
rows time an autograd-recorded chain of small ops (so that the device never holds the host back):

  autograd_forward_op     one op of y = y * w with w requiring grad: Python, the dispatcher,
                          autograd's recording and the launch
  autograd_backward_node  that chain's backward, per node: the autograd engine's own work per
                          node, the backward op's dispatch and its launches
  no_grad_op              the same op under torch.no_grad (the optimizer's and routing's ops)
  view_op                 a view under autograd (split, transpose, reshape): host time, no kernel

Two rows time a layer with the anatomy's structure (layer.py's ops: RMSNorm, QKV, RoPE written
out, attention, output projection, fp32 router with top-k, gathered experts, SwiGLU written out,
an index_add back): its host issue time, split into the forward and the backward (`layer_forward`,
`layer_backward`), with the kernels the profiler saw each launch on the GPU (`kernels`).

On `--device cpu` the ops run on tiny CPU tensors: the rows then measure the framework's share
alone (no launch), on this machine's CPU, and `kernels` counts top-level operators and autograd
nodes.
That share is what NodeEmu's h100_sxm5 host_ops.csv takes the forward/backward split from.
"""

import time

import torch
import torch.nn.functional as F

from gpu_measure.timing import fmt

CHAIN = 64  # ops per timed chain: enough that the loop's own cost is a small share


def chain_costs(t, dev):
    w = torch.full((16,), 1.0001, device=dev, requires_grad=True)
    x0 = torch.ones(16, device=dev)

    def forward():
        y = x0
        for _ in range(CHAIN):
            y = y * w
        return y

    fwd = t.host(forward, 1) / CHAIN
    backward_s = []
    for _ in range(max(3, t.repeats)):
        y = forward().sum()
        t.sync()
        t0 = time.perf_counter()
        y.backward()
        backward_s.append(time.perf_counter() - t0)
        t.sync()
    backward_s.sort()
    bwd = backward_s[len(backward_s) // 2] / CHAIN

    def no_grad():
        with torch.no_grad():
            y = x0
            for _ in range(CHAIN):
                y = y * w
        return y

    ng = t.host(no_grad, 1) / CHAIN
    z = torch.ones(4, 4, device=dev, requires_grad=True) * 1

    def views():
        v = z
        for _ in range(CHAIN // 2):
            v = v.transpose(0, 1)
            v = v.view(4, 4)
        return v

    view = t.host(views, 1) / CHAIN
    return [["autograd_forward_op", fmt(fwd, 3), ""], ["autograd_backward_node", fmt(bwd, 3), ""],
            ["no_grad_op", fmt(ng, 3), ""], ["view_op", fmt(view, 3), ""]]


def rms_norm(x, w):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def grouped(x, w, offs):
    if hasattr(torch, "_grouped_mm") and x.is_cuda:
        return torch._grouped_mm(x, w, offs=offs)
    return torch.bmm(x.view(w.shape[0], -1, x.shape[-1]), w).view(-1, w.shape[-1])


def anatomy_layer(dev, dtype, seq, h, heads, kv, d, experts, rows, ffn):
    """layer.py's forward, at any size (a CPU run uses tiny ones)."""
    torch.manual_seed(0)

    def p(*sh):
        return (torch.randn(*sh, device=dev, dtype=dtype) * 0.02).requires_grad_()
    wqkv, wo, wr = p(h, (heads + 2 * kv) * d), p(heads * d, h), p(h, 16)
    w1, w2 = p(experts, h, 2 * ffn), p(experts, ffn, h)
    ln1 = torch.ones(h, device=dev, dtype=dtype, requires_grad=True)
    ln2 = torch.ones(h, device=dev, dtype=dtype, requires_grad=True)
    ang = torch.outer(torch.arange(seq, device=dev, dtype=torch.float32),
                      torch.ones(d // 2, device=dev))
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(dtype)[None, None]
    sin = torch.cat((ang.sin(), ang.sin()), -1).to(dtype)[None, None]
    x = torch.randn(seq, h, device=dev, dtype=dtype, requires_grad=True)
    tot = experts * rows
    src = torch.randint(0, seq, (tot,), device=dev)
    offs = torch.arange(rows, tot + 1, rows, device=dev, dtype=torch.int32)

    def rope(t):
        t1, t2 = t[..., : d // 2], t[..., d // 2:]
        return t * cos + torch.cat((-t2, t1), -1) * sin

    def forward():
        hn = rms_norm(x, ln1)
        q, k, v = (hn @ wqkv).split([heads * d, kv * d, kv * d], -1)
        q = q.view(seq, heads, d).transpose(0, 1)[None]
        k = k.view(seq, kv, d).transpose(0, 1)[None]
        v = v.view(seq, kv, d).transpose(0, 1)[None]
        o = attention(rope(q), rope(k), v)[0].transpose(0, 1).reshape(seq, heads * d)
        x2 = x + o @ wo
        hm = rms_norm(x2, ln2)
        probs, _ = torch.topk(torch.softmax(hm.float() @ wr.float(), -1), 8, -1)
        a = grouped(hm.index_select(0, src), w1, offs)
        a = F.silu(a[:, :ffn]) * a[:, ffn:]
        y = grouped(a, w2, offs)
        out = torch.zeros(seq, h, device=dev, dtype=dtype).index_add(0, src, y)
        return x2 + out + 0 * probs.sum().to(dtype)
    return forward


def launched(fn, cuda):
    """How many GPU kernels (CUDA), or operators and autograd nodes (CPU), one call of fn runs."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    # Top-level operators (each one dispatch, as a launched kernel is on the GPU) and the nodes
    # the autograd engine evaluates (backward runs on the engine's thread, under those events).
    return sum(1 for e in prof.events()
               if (e.cpu_parent is None and e.name.startswith("aten::"))
               or e.name.startswith("autograd::engine::evaluate_function"))


def layer_costs(t, cfg):
    cuda = cfg.device == "cuda"
    if cuda:
        forward = anatomy_layer("cuda", torch.bfloat16, 4096, 2048, 32, 4, 128, 8, 4096, 768)
    else:
        forward = anatomy_layer("cpu", torch.float32, 16, 64, 4, 2, 16, 4, 8, 32)
    y = forward()
    gy = torch.randn_like(y)
    for _ in range(3):
        forward().backward(gy)
    t.sync()
    fwd_kernels = launched(forward, cuda)
    bwd_kernels = launched(lambda: forward().backward(gy), cuda) - fwd_kernels
    fwd_s, bwd_s = [], []
    for _ in range(max(5, t.repeats)):
        t.sync()
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        out.backward(gy)
        t2 = time.perf_counter()
        t.sync()
        fwd_s.append(t1 - t0)
        bwd_s.append(t2 - t1)
    fwd_s.sort()
    bwd_s.sort()
    return [["layer_forward", fmt(fwd_s[len(fwd_s) // 2], 4), str(fwd_kernels)],
            ["layer_backward", fmt(bwd_s[len(bwd_s) // 2], 4), str(bwd_kernels)]]


def host_op_table(t, cfg, tables):
    rows = chain_costs(t, cfg.device) + layer_costs(t, cfg)
    tables.write("host_ops.csv", ["what", "seconds", "kernels"], rows)
