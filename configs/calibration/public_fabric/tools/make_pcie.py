# pcie_numa.csv: rows hand-entered from the cited sources (numbers copied exactly; unit conversions flagged in notes).
import csv
AZ='https://github.com/Azure/AI-benchmarking-guide/blob/8fd0c6e1bd0f853ef8f0500a3640a7d80a2a92ef/'
NVBW_AFF='nvbandwidth sets CPU affinity to the target GPU\'s NUMA node before cuMemHostAlloc (https://github.com/NVIDIA/nvbandwidth/blob/66746a3bef61c8c2e12ab34955310da70b9e38cb/memcpy.cpp#L208-L217, present since initial commit 2022; disable with -d), so host buffer is NUMA-local unless -d was used'
rows=[]
def r(system,gpu,direction,pinned,numa,bytes_,bw,src,notes): rows.append(dict(system=system,gpu=gpu,direction=direction,pinned=pinned,numa_placement=numa,bytes=bytes_,bandwidth_gbs=bw,source=src,notes=notes))
# Azure AI-benchmarking-guide
for fn,sysn,gpu,h2d,d2h in (('Azure_Results/ND_H100_v5_results.md','Azure ND H100 v5 VM (Xeon Platinum 8480C)','H100 80GB HBM3 SXM',51,52),
                             ('Azure_Results/ND_H200_v5_results.md','Azure ND H200 v5 VM (Xeon Platinum 8480C)','H200 141GB SXM',52,52)):
    for d,v,line in (('H2D',h2d,58),('D2H',d2h,59)):
        r(sysn,gpu,d,'yes (cuMemHostAlloc in nvbandwidth)','local (by nvbandwidth design, see notes)','',v,
          f'{AZ}{fn}#L{line} (table "NV Bandwidth"); command in {AZ}Benchmarks/NVBandwidth.py#L62-L67',
          f'vendor (Microsoft) published; nvbandwidth test {"host_to_device" if d=="H2D" else "device_to_host"}_memcpy_sm (SM copy kernel); single value reported for the 8-GPU VM (per-GPU vs aggregate not stated; magnitude implies per-GPU); buffer size = nvbandwidth default (64 MiB in v0.5, 512 MiB later; version not recorded); {NVBW_AFF}')
# nvbandwidth issue 24
h2d=[35.19,35.25,35.30,35.03,35.25,35.32,35.39,35.06]; d2h=[52.77,52.77,52.77,52.78,52.76,52.77,52.78,52.77]
for g,(a,b) in enumerate(zip(h2d,d2h)):
    for d,v in (('H2D',a),('D2H',b)):
        r('unnamed "H100 cluster" node (8 GPUs; CPU/socket layout not stated)','H100',d,'yes (nvbandwidth)','local (by nvbandwidth design)','',v,
          'https://github.com/NVIDIA/nvbandwidth/issues/24 (issue description 2024-09-11; matrix row CPU 0, column GPU %d)'%g,
          f'GPU {g}; nvbandwidth {"host_to_device" if d=="H2D" else "device_to_host"}_memcpy_sm; reporter asks why SM H2D (~35) << SM D2H (~52.8); other users saw the same on H20/H800; no maintainer answer in thread; no visible difference between GPUs 0-3 and 4-7 => no cross-socket penalty visible when memory is NUMA-local; {NVBW_AFF}')
# nvbandwidth issue 6
for g,v in enumerate([14.2,57.06,56.68,57.07]):
    r('single-node H100 VM with 4 GPUs (cloud/vendor not stated)','H100','H2D','yes (nvbandwidth)','local (by nvbandwidth design) - anomaly on device 0 unexplained','',v,
      'https://github.com/NVIDIA/nvbandwidth/issues/6 (issue description 2023-07-11)',
      f'GPU {g}; reporter: "bandwidths between the host to device 0, 1, 2 and 3 were 14.2, 57.06, 56.68 and 57.07"; test name not given (nvbandwidth host->device); cause of device-0 drop not established in the excerpt')
# Voltage Park / GT benchmarking README (docs page)
for d,v in (('H2D',54.8),('D2H',46.8)):
    r('Voltage Park bare-metal node, 8x H100 80GB HBM3 SXM5 (4-node cluster, 3.2 Tbps IB)','H100 80GB HBM3 SXM5',d,'not stated','not stated','',v,
      'https://github.com/aigatech/vpbenchmarking (README, table "Memory Bandwidth — Single Node (8× H100)"; read via search-index page text, repo not fetchable here)',
      f'README: "GPU {d} (PCIe) {v} GB/s"{" — 87% of PCIe 5.0 x16" if d=="H2D" else ""}; tool and NUMA binding not visible in the excerpt; provider-partnered benchmark (marketing context stated in README)')
# XLA PR 21708 DGX H100 concurrent D2H
for numa,gib in (('local (NUMA-pinned host buffers)',33),('not pinned to GPU NUMA node (default allocation; mix of local/remote)',13.5)):
    r('NVIDIA DGX H100 (2x CPU, 8x H100)','H100 SXM','D2H (all 8 GPUs concurrently)','yes (XLA pinned host buffers)',numa,'',round(gib*1.073741824,2),
      'https://github.com/openxla/xla/pull/21708 (PR description by olupton, 2025-01-22)',
      f'source states "around {gib} GiB/s" (converted to GB/s here, x1.0737); "a benchmark that triggers large, concurrent, copies from all devices to the host"; aggregate vs per-GPU not stated explicitly; ratio ~2.4x; earlier PR https://github.com/openxla/xla/pull/15216 states "~2x improvement in throughput of overlapped D2H copies from 8xH100 on a DGX node"')
# gearshifft PR 82 (P100 PCIe, 2-socket, bandwidthTest)
for d,loc,rem in (('H2D',12150.7,3783.4),('D2H',12890.6,2539.2)):
    for numa,v,cmd in (('local (numactl -m0 -N0; GPU0 on socket 0)',loc,'numactl -m0 -N0 bandwidthTest'),('remote (numactl -m1 -N1)',rem,'numactl -m1 -N1 bandwidthTest')):
        r('2-socket Intel Xeon server (model not stated), Tesla P100-PCIE-16GB','P100 PCIe 16GB (PCIe Gen3)',d,'yes (bandwidthTest PINNED)',numa,33554432,round(v/1000,4),
          'https://github.com/mpicbg-scicomp/gearshifft/pull/82 (comment by psteinb 2017-03-27)',
          f'bandwidthTest quick mode printed {v} MB/s (divided by 1000 here); cmd: {cmd}; nvidia-smi topo shows GPU0 CPU affinity 0-5; OLD HARDWARE (2017, PCIe Gen3) - shows remote-socket H2D at ~0.31x and D2H at ~0.20x of local; not representative of Sapphire Rapids/UPI2 + Gen5')
# ROCm issue 129 (counterexample)
for numa in ('local NUMA node','remote NUMA node'):
    r('2-socket AMD EPYC 9554 + 10x AMD MI210','AMD Instinct MI210 (PCIe Gen4 x16)','H2D and D2H (unidirectional)','yes (rocm-bandwidth-test)',numa,'',28,
      'https://github.com/ROCm/rocm_bandwidth_test/issues/129 (issue description 2025-08-19)',
      'source: "nearly identical from either NUMA node to any GPU: ~28 GB/s (uni), ~45 GB/s (bi), which looks like PCIe Gen4 x16 saturation" (approximate values); reporter unsure whether the tool binds memory to a node - counterexample/uncertain; AMD GPU, not NVIDIA')
# torchtitan PR 3519 (GB200 Grace, claim)
for numa,v in (('local (NUMA binding on)',330),('cross-NUMA',115)):
    r('NVIDIA GB200 (Grace CPU, NVLink-C2C) - NOT a PCIe x86 two-socket server','B200 (GB200 superchip)','D2H',"yes (pinned memory)",numa,'',v,
      'https://github.com/pytorch/torchtitan/pull/3519 (PR description by mlazos, 2026-06-04)',
      'source: "yielding ~330 GB/s D2H bandwidth vs ~115 GB/s cross-NUMA (~3x improvement)"; approximate claim, benchmark not shown; C2C system, listed only as a NUMA-penalty datapoint')
cols='system,gpu,direction,pinned,numa_placement,bytes,bandwidth_gbs,source,notes'.split(',')
with open('/work/research52/pcie_numa.csv','w',newline='') as f:
    w=csv.DictWriter(f,fieldnames=cols); w.writeheader(); [w.writerow(x) for x in rows]
print(len(rows))
