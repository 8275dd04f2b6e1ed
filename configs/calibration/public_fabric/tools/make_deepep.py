# Extracts DeepEP / HybridEP README performance tables verbatim from the fetched git mirror.
import csv, re, subprocess
R='/work/.mirror/deepseek-ai+DeepEP/repo'
def show(ref,path): return subprocess.check_output(['git','-C',R,'show',f'{ref}:{path}'],text=True).splitlines()
def full(ref): return subprocess.check_output(['git','-C',R,'rev-parse',ref],text=True).strip()
U='https://github.com/deepseek-ai/DeepEP/blob/{c}/{p}#L{a}'
rows=[]
def cells(l): return [c.strip() for c in l.strip().strip('|').split('|')]
def num(s): return re.sub(r'[^0-9.]','',s)
def add(**k): rows.append(k)
# ---- V1 tables (current text: docs/legacy.md on main; identical in README.md from 3b1045d .. 567632d)
def v1(ref,path,label,extra_n,extra_l):
    c=full(ref); L=show(ref,path)
    sec=None
    for i,l in enumerate(L,1):
        if 'Normal kernels with NVLink' in l: sec='normal'
        if 'Low-latency kernels with pure RDMA' in l: sec='ll'
        if not l.startswith('|'): continue
        x=cells(l)
        if sec=='normal' and x[0] in('Intranode','Internode'):
            for kind,ep,bw in (('dispatch_fp8',x[1],x[2]),('combine_bf16',x[3],x[4])):
                link='NVLink' if 'NVLink' in bw else 'RDMA'
                ep=int(ep)
                add(library='DeepEP V1',gpu='H800',mode='normal_'+x[0].lower(),kind=kind,ep_ranks=ep,nodes=ep//8 if True else '',tokens=4096,hidden=7168,topk=8,sms='',
                    bandwidth_gbs=num(bw),bw_kind=f'bottleneck bandwidth ({link})',latency_us='',
                    source=U.format(c=c,p=path,a=i)+f' ({label}; table "Normal kernels with NVLink and RDMA forwarding")',
                    notes='H800 ~160 GB/s NVLink; 1x CX7 IB 400 Gb/s (~50 GB/s) per GPU; DeepSeek-V3 pretraining setting: 4096 tokens/batch, top-4 groups, top-8 experts, FP8 dispatch, BF16 combine; nodes = EP/8 (inferred, 8 GPUs per node); #SMs not stated in table'+extra_n)
        if sec=='ll' and re.match(r'\d',x[0]):
            for kind,ep,lat,bw in (('dispatch_fp8',x[0],x[1],x[2]),('combine_bf16',x[3],x[4],x[5])):
                ep=int(ep)
                add(library='DeepEP V1',gpu='H800',mode='low_latency',kind=kind,ep_ranks=ep,nodes=ep//8,tokens=128,hidden=7168,topk=8,sms='',
                    bandwidth_gbs=num(bw),bw_kind='RDMA bandwidth (as labelled in README)',latency_us=num(lat),
                    source=U.format(c=c,p=path,a=i)+f' ({label}; table "Low-latency kernels with pure RDMA")',
                    notes='H800 + 1x CX7 IB 400 Gb/s per GPU; 128 tokens/batch, top-8, FP8 dispatch, BF16 combine; nodes = EP/8 (inferred, 8 GPUs per node); #SMs not stated'+extra_l)
v1('dd758caf451848bd150e1046af3d0a73e5fff38d','docs/legacy.md','main branch docs/legacy.md, current V1 numbers',
   '; current V1 numbers (same values in README.md since commit 3b1045d 2025-04-22 "Fix the performance data", after Tencent PR #130)',
   '; current V1 numbers (README.md since d8dd185 2025-06-05): README News says LL kernels now leverage NVLink as much as possible (PR #173), so EP8..64 LL values include NVLink-carried traffic and EP8 exceeds NIC line rate')
v1('ebfe47e','README.md','initial README 2025-02-24, SUPERSEDED',
   '; SUPERSEDED original release numbers (before Tencent PR #130 optimisation)',
   '; SUPERSEDED original release numbers (pure RDMA, before PR #173 NVLink use)')
# ---- V2 table (README.md main)
c=full('dd758ca'); L=show('dd758ca','README.md')
for i,l in enumerate(L,1):
    if l.startswith('| SM'):
        x=cells(l)
        m=re.match(r'EP (\d+)(?: x (\d+))?',x[2]); ep=int(m.group(1))*(int(m.group(2) or 1)); nodes=int(m.group(2) or 1)
        for kind,bw in (('dispatch_fp8',x[3]),('combine_bf16',x[4])):
            link='NVLink' if 'NVLink' in bw else 'RDMA'
            add(library='DeepEP V2 (EPv2, NCCL Gin backend)',gpu=x[0]+(' (Hopper; exact SKU not stated)' if x[0]=='SM90' else ' (Blackwell; exact SKU not stated)'),
                mode='v2_'+('internode' if nodes>1 else 'intranode'),kind=kind,ep_ranks=ep,nodes=nodes,tokens=8192,hidden=7168,topk=8,sms=num(x[5]),
                bandwidth_gbs=num(bw),bw_kind=f'bottleneck bandwidth ({link}), logical',latency_us='',
                source=U.format(c=c,p='README.md',a=i)+' (main README "Performance" table)',
                notes=f'Topo "{x[2]}", NIC "{x[1]}", SMs "{x[5]}"; README: 8K tokens/batch, 7168 hidden, top-8, FP8 dispatch, BF16 combine; "results are logical bandwidth ... under EP 8 x 2, 90 GB/s actually contains local rank traffic"')
# ---- HybridEP tables (hybrid-ep branch docs/README_Hybrid-EP.md)
c=full('hybrid-ep'); P='docs/README_Hybrid-EP.md'; L=show('hybrid-ep',P)
plat=None; sub=None; ranks=None; impl=None; meas=None
base='4096 tokens, hidden 7168, topk 8, random uniform router, 8 local experts; "All bandwidth values represent algorithm bandwidth"'
for i,l in enumerate(L,1):
    if l.startswith('### H100 Platform'): plat='H100'
    if l.startswith('### B200 Platform'): plat='B200'
    if l.startswith('### GB200 Platform'): plat='GB200'
    if 'HybridEP Performance Results' in l: sub='HybridEP'
    if 'DeepEP Performance Results' in l: sub='DeepEP'
    if l.startswith('## 🚀'): break
    if not l.startswith('|'): continue
    x=cells(l)
    if plat in('H100','GB200'):
        if x[0] and not re.match(r'\d',x[0]): continue
        if not re.match(r'\d',x[1] if len(x)>1 else ''): continue
        if x[0]: ranks=int(x[0])
        sms=int(x[1]); vals=x[2:]
        names=['dispatch_fp8','dispatch_bf16','combine_bf16']
        for j,v in enumerate(vals):
            if not v: continue
            meas='Torch API' if j<3 else 'Kernel only'
            if plat=='H100':
                net='multi-node over IB (README heading "IB Bandwidth in GB/s"); nodes not stated (8 GPUs/node would give ranks/8)'
            else:
                net='GB200: transport not stated in table (install section mentions intra-node and MNNVL; presumably within one NVL72 NVLink domain); nodes not stated'
            add(library=sub if sub=='HybridEP' else 'DeepEP (as measured by NVIDIA, HybridEP doc)',gpu=plat,mode='hybrid-ep' if sub=='HybridEP' else 'normal',kind=names[j%3],
                ep_ranks=ranks,nodes='',tokens=4096,hidden=7168,topk=8,sms=sms,bandwidth_gbs=v,bw_kind=f'algbw ({meas})',latency_us='',
                source=U.format(c=c,p=P,a=i)+f' (hybrid-ep branch; "{plat} Platform" table, {sub} results)',
                notes=base+'; '+net+'; combine dtype not stated in table (column "Combine")')
    if plat=='B200' and len(x)>=6 and re.match(r'\d',x[2].strip('*')):
        if x[0]: impl=x[0].strip('*'); 
        if x[1]: meas=x[1]
        for j,v in enumerate(x[3:6]):
            add(library=impl if impl=='HybridEP' else 'DeepEP (as measured by NVIDIA, HybridEP doc)',gpu='B200',mode='hybrid-ep' if impl=='HybridEP' else 'normal',
                kind=['dispatch_fp8','dispatch_bf16','combine_bf16'][j],ep_ranks=8,nodes=1,tokens=4096,hidden=7168,topk=8,sms=x[2],
                bandwidth_gbs=v.strip('*'),bw_kind=f'bandwidth ({meas})',latency_us='',
                source=U.format(c=c,p=P,a=i)+' (hybrid-ep branch; "B200 Platform" Performance Comparison table)',
                notes='4096 tokens, hidden 7168, topk 8, random uniform router, 8 local experts, Ranks 8 (single B200 node, NVLink); table does not say algbw explicitly')
# ---- PCIe (H20, NVLink disabled) hybrid-ep branch docs/README_PCIe.md
P='docs/README_PCIe.md'; L=show('hybrid-ep',P)
for i,l in enumerate(L,1):
    if l.startswith('|') and re.match(r'\d',cells(l)[0]):
        x=cells(l)
        for kind,ep,v in (('dispatch_fp8',x[0],x[1]),('combine_bf16',x[2],x[3])):
            add(library='DeepEP PCIe kernel (hybrid-ep branch)',gpu='H20 (NVLink disabled)',mode='normal_pcie_rdma_only',kind=kind,ep_ranks=int(ep),nodes=int(ep)//8,
                tokens=4096,hidden=7168,topk=8,sms=24,bandwidth_gbs=num(v),bw_kind='bandwidth (all traffic via RDMA NIC)',latency_us='',
                source=U.format(c=c,p=P,a=i)+' (hybrid-ep branch; "H20 Platform" table)',
                notes='8x CX7 per node, one GPU one NIC; intra- and inter-node traffic both through NIC; nodes = EP/8')
cols='library,gpu,mode,kind,ep_ranks,nodes,tokens,hidden,topk,sms,bandwidth_gbs,bw_kind,latency_us,source,notes'.split(',')
with open('/work/research52/deepep_hybridep.csv','w',newline='') as f:
    w=csv.DictWriter(f,fieldnames=cols); w.writeheader(); [w.writerow(r) for r in rows]
print(len(rows))
