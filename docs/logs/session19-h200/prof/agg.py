import re,sys,collections
for f in sys.argv[1:]:
    txt=open(f).read()
    agg=collections.defaultdict(lambda: collections.defaultdict(list))
    for m in re.finditer(r'PROF r(\d+) t(\d+) span (\d+) inplace (\w+) calls (\d+):((?: \w+=[\d.]+)+?)(?= ?PROF|\n|$)',txt):
        key=(int(m.group(3))>>20,m.group(4),'t'+m.group(2))
        for kv in m.group(6).split():
            k,v=kv.split('=')
            try: agg[key][k].append(float(v))
            except: pass
    print('==',f)
    for key in sorted(agg):
        d=agg[key]
        print(key, ' '.join(f"{k}={sum(v)/len(v):.0f}[{min(v):.0f}-{max(v):.0f}]" if not k.endswith('GBs') else f"{k}={sum(v)/len(v):.2f}" for k,v in d.items()))
