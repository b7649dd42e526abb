# Independent reference for the DESIGN.md GPU-timeline definitions on Kineto JSON,
# in exact decimal arithmetic (pure Python). The golden values in
# analysis/importers/reader_test.cc were computed with it:
#   python3 scripts/timeline_reference.py ../shared/traces/kineto/FILE.json.gz
import gzip, json, sys, collections, decimal
def union(iv):
    iv=sorted((s,e) for s,e in iv if e>s); out=[]
    for s,e in iv:
        if out and s<=out[-1][1]: out[-1][1]=max(out[-1][1],e)
        else: out.append([s,e])
    return out
def sub(a,b):
    out=[]
    for s,e in a:
        cur=s
        for bs,be in b:
            if be<=cur or bs>=e: continue
            if bs>cur: out.append([cur,bs])
            cur=max(cur,be)
        if cur<e: out.append([cur,e])
    return out
L=lambda x: sum(e-s for s,e in x)
d=json.load(gzip.open(sys.argv[1]), parse_float=decimal.Decimal)
ev=d['traceEvents'] if isinstance(d,dict) else d
gpu=collections.defaultdict(list); steps=collections.defaultdict(list)
for e in ev:
    if e.get('ph')!='X': continue
    c=e.get('cat'); a=e.get('args',{})
    if c in ('kernel','Kernel','gpu_memcpy','Memcpy','gpu_memset','Memset'):
        dev=a.get('device',e.get('pid'))
        if e['dur']<=0: continue
        k='memcpy' if c in('gpu_memcpy','Memcpy') else ('comm' if c in ('kernel','Kernel') and ('nccl' in e['name'].lower() or 'rccl' in e['name'].lower()) else 'comp')
        gpu[dev].append((k,decimal.Decimal(e['ts']),decimal.Decimal(e['ts'])+decimal.Decimal(e['dur'])))
    if c=='gpu_user_annotation' and e['name'].startswith('ProfilerStep#'):
        steps[a.get('device',e.get('pid'))].append((decimal.Decimal(e['ts']),decimal.Decimal(e['ts'])+decimal.Decimal(e['dur'])))
for dev in sorted(gpu):
    evs=gpu[dev]
    if steps[dev]: evs=[x for x in evs if any(s<=x[1]<e for s,e in steps[dev])]
    comp=union([(s,e) for k,s,e in evs if k=='comp']); comm=union([(s,e) for k,s,e in evs if k=='comm']); mc=union([(s,e) for k,s,e in evs if k=='memcpy'])
    allu=union(comp+comm+mc)
    total=allu[-1][1]-allu[0][0]
    print(dev, len(evs), dict(computation=L(comp), exposed_comm=L(sub(comm,comp)), exposed_memcpy=L(sub(sub(mc,comp),comm)), busy=L(allu), total=total, total_comm=L(comm), total_memcpy=L(mc)))
