# Builds nccl_tests_h100.csv from (a) files in fetched git mirrors and (b) verbatim issue transcriptions.
import csv, re, subprocess, sys
OUT='/work/research52/nccl_tests_h100.csv'
rows=[]; warn=[]
def git(repo, *a): return subprocess.check_output(['git','-C',f'/work/.mirror/{repo}/repo',*a],text=True)
LINE=re.compile(r'^\s*(?:\d+:\s+|\[\d+,\d+\]<stdout>:\s*)?(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)(?:\s+([\d.]+)\s+([\d.]+)\s+([\d.]+))?')
FACT={'all_reduce':lambda n:2*(n-1)/n,'all_gather':lambda n:(n-1)/n,'reduce_scatter':lambda n:(n-1)/n,'alltoall':lambda n:(n-1)/n,'sendrecv':lambda n:1}
def check(coll,n,size,t,alg,bus,tag):
    if t and size:
        a2=size/(float(t)*1e3)
        if alg and float(alg)>0.5 and abs(a2-float(alg))/float(alg)>0.03: warn.append(f'{tag} size {size}: algbw {alg} vs size/time {a2:.2f}')
    if alg and bus and float(alg)>0.5:
        b2=float(alg)*FACT[coll](n)
        if abs(b2-float(bus))/float(bus)>0.03: warn.append(f'{tag} size {size}: busbw {bus} vs algbw*factor {b2:.2f}')
def add(coll,scope,gpus,nodes,size,t,alg,bus,src,notes):
    rows.append(dict(collective=coll,scope=scope,gpus=gpus,nodes=nodes,bytes=size,time_us=t,algbw_gbs=alg,busbw_gbs=bus,source=src,notes=notes))
def nccl_lines(text_lines, coll, scope, gpus, nodes, src_fn, notes, tag):
    for i,l in text_lines:
        m=LINE.match(l)
        if not m: continue
        size,_,_,_,_,t,alg,bus,_,t2,alg2,bus2=m.groups()
        size=int(size)
        check(coll,gpus,size,t,alg,bus,tag)
        n=notes+'; out-of-place values'+(f'; in-place: time_us={t2} algbw={alg2} busbw={bus2}' if t2 else '')
        add(coll,scope,gpus,nodes,size,t,alg,bus,src_fn(i),n)

# 1) NVIDIA/dgxc-benchmarking nccl/README.md sample output (DGX H100, 8 GPUs, single node)
repo='NVIDIA+dgxc-benchmarking'; c=git(repo,'rev-parse','HEAD').strip(); L=git(repo,'show','HEAD:nccl/README.md').splitlines()
nccl_lines(list(enumerate(L,1)),'all_reduce','intranode_nvlink',8,1,
  lambda i:f'https://github.com/NVIDIA/dgxc-benchmarking/blob/{c}/nccl/README.md#L{i} (section "View sample output (AllReduce excerpt)")',
  'system=NVIDIA DGX H100 (recipe targets "NVIDIA H100-DGX GPUs", IB Quantum-2/CX7); vendor-published sample log; 8x H100 80GB HBM3 on one host (pool0-01806); algorithm not printed (NCCL default selection; the large-size busbw ~480 GB/s is consistent with NVLS per maintainer statements in nccl-tests#212); NCCL version not printed; header also prints non-standard fields "side_work: 0 work_sms: 0 direction: H2D"','dgxc')

# 2) Azure/AI-benchmarking-guide ND H100 v5 / ND H200 v5 tables (allreduce NVLS, in-place busbw only)
repo='Azure+AI-benchmarking-guide'; c=git(repo,'rev-parse','HEAD').strip()
for fn,gpu,nccl in (('Azure_Results/ND_H100_v5_results.md','H100 80GB HBM3','2.18.5'),('Azure_Results/ND_H200_v5_results.md','H200 141GB','2.20.5')):
    L=git(repo,'show','HEAD:'+fn).splitlines(); sec=False; k=0
    for i,l in enumerate(L,1):
        if l.startswith('## NCCL Bandwidth'): sec=True; continue
        if sec and l.startswith('## '): break
        m=re.match(r'\|\s*(\d+)([KMG])\s*\|\s*([\d.]+)\s*\|',l) if sec else None
        if m:
            size=1024*2**k; k+=1
            lab=m.group(1)+m.group(2)
            add('all_reduce','intranode_nvlink',8,1,size,'','',m.group(3),
                f'https://github.com/Azure/AI-benchmarking-guide/blob/{c}/{fn}#L{i} (section "NCCL Bandwidth")',
                f'system=Azure {"ND H100 v5" if "H100" in fn else "ND H200 v5"} VM ({gpu}, Xeon Platinum 8480C, NCCL {nccl}); source says busbw of AllReduce NVLS algorithm, in-place, 1KB-8GB (script forces NCCL_ALGO=NVLS for all sizes, -n 40 iters); source size label "{lab}" mapped to 1024*2^{k-1} bytes: labels come from a hard-coded list for all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40 in https://github.com/Azure/AI-benchmarking-guide/blob/{c}/Benchmarks/NCCLBandwidth.py#L63-L78 (value = field 12 = in-place busbw); {"H200 row" if "H200" in fn else ""}')

# 3) GCP A3 Mega (GPUDirect-TCPXO) 2 nodes, lessizzmore/create-a3mega-ztan-fork
repo='lessizzmore+create-a3mega-ztan-fork'; c=git(repo,'rev-parse','HEAD').strip(); fn='ztan-NCCL-test-result.markdown'
L=git(repo,'show','HEAD:'+fn).splitlines()
nccl_lines(list(enumerate(L,1)),'all_reduce','internode_gcp_tcpxo',16,2,
  lambda i:f'https://github.com/lessizzmore/create-a3mega-ztan-fork/blob/{c}/{fn}#L{i}',
  'system=2x GCP a3-megagpu-8g VMs (H100 80GB HBM3), repo is a guide for GPUDirect-TCPXO images (8 NICs x 200 Gb/s per VM per GCP spec; transport assumed TCPXO, not printed in log); default algo; community fork, not an official Google result','a3mega')

# 4) AWS p5.48xlarge EFA, crazyguitar/aws-gpu-communication-benchmark data/*.csv
repo='crazyguitar+aws-gpu-communication-benchmark'; c=git(repo,'rev-parse','HEAD').strip()
for coll,fn in (('all_gather','data/nccl_all_gather.csv'),('all_reduce','data/nccl_all_reduce.csv'),('alltoall','data/nccl_alltoall.csv')):
    L=git(repo,'show','HEAD:'+fn).splitlines()
    for i,l in enumerate(L,1):
        if i==1: continue
        x=[s.strip() for s in l.split(',')]
        nodes,gpus,mb=int(x[0]),int(x[1]),int(x[2])
        size=mb*1048576
        check(coll,gpus,size,'',x[5],x[6],'p5')
        add(coll,'internode_efa',gpus,nodes,size,'',x[5],x[6],
            f'https://github.com/crazyguitar/aws-gpu-communication-benchmark/blob/{c}/{fn}#L{i}',
            f'system=AWS p5.48xlarge (8x H100, 32x EFA = 3200 Gb/s per instance; README: "four EFA interfaces per GPU"), SageMaker HyperPod EKS; aws-ofi-nccl tuner plugin, NCCL_BUFFSIZE=8388608, NCCL_P2P_NET_CHUNKSIZE=524288, iters 1000; source column size(MB)={mb} converted as MiB (test run with -b 32M); no time column in source; out-of-place values; in-place algbw={x[7]} busbw={x[8]}')

# 5) transcribed issue tables
blk=None; blocks=[]
for l in open('/work/research52/raw/issue_tables.txt'):
    l=l.rstrip('\n')
    if l.startswith('### BLOCK'): blk={'id':l.split()[2],'lines':[]}; blocks.append(blk); continue
    if blk is None or l.startswith('#'): continue
    m=re.match(r'^(collective|scope|gpus|nodes|source|notes): (.*)$',l)
    if m: blk[m.group(1)]=m.group(2); continue
    blk['lines'].append(l)
for b in blocks:
    nccl_lines([(0,l) for l in b['lines']],b['collective'],b['scope'],int(b['gpus']),int(b['nodes']),lambda i,b=b:b['source'],b['notes']+'; transcribed verbatim into raw/issue_tables.txt block '+b['id'],b['id'])

cols='collective,scope,gpus,nodes,bytes,time_us,algbw_gbs,busbw_gbs,source,notes'.split(',')
with open(OUT,'w',newline='') as f:
    w=csv.DictWriter(f,fieldnames=cols); w.writeheader(); [w.writerow(r) for r in rows]
print(len(rows),'rows'); print('\n'.join(warn[:80])); print(len(warn),'warnings')
