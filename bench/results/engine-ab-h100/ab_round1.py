import json,statistics
def load(f):
    d={}
    for l in open(f):
        r=json.loads(l); d[(r['tool'],r['op'],r['ranks'],r.get('transport','-'),r['size'])]=r['time_us']
    return d
b=load('before-1.jsonl'); a=load('after-1.jsonl')
gloo={(k[1],k[2],k[4]):v for k,v in b.items() if k[0]!='tensorcomm'}
def fmt(n):
    for u,s in [('M',20),('K',10)]:
        if n>=1<<s and n%(1<<s)==0: return f"{n>>s}{u}"
    return str(n)
sizes=[8,512,32768,2<<20,8<<20,32<<20]
print("| op | ranks | transport | " + " | ".join(fmt(s) for s in sizes)+" |")
print("|---|---|---|"+"---|"*len(sizes))
for op in ['all_reduce','broadcast']:
  for n in [2,4,8]:
    for tr in ['shm','tcp']:
      cells=[]
      for s in sizes:
        g=gloo.get((op,n,s)); bb=b.get(('tensorcomm',op,n,tr,s)); aa=a.get(('tensorcomm',op,n,tr,s))
        cells.append(f"{bb/g:.2f} / {aa/g:.2f}" if g and bb and aa else "-")
      print(f"| {op} | {n} | {tr} | "+" | ".join(cells)+" |")
rs=[a[k]/b[k] for k in a if k in b]
print()
print(f"after/before time, all {len(rs)} rows: median {statistics.median(rs):.2f}, min {min(rs):.2f}, max {max(rs):.2f}")
for op in ['all_reduce','broadcast']:
  for tr in ['shm','tcp']:
    r=[a[k]/b[k] for k in a if k in b and k[1]==op and k[3]==tr]
    print(f"- {op} {tr}: median {statistics.median(r):.2f} (min {min(r):.2f}, max {max(r):.2f}) over {len(r)} rows")
