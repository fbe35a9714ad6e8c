import re,glob,statistics as st,sys
rows={}
for f in sorted([g for g in glob.glob(sys.argv[1]+'/*-[0-9].txt')]):
    b,i=f.split('/')[-1][:-4].rsplit('-',1)
    t=open(f).read()
    for kind,pat in (('closed',r'closed c=32\s+(\d+) routes/s.*?decide p99 ([\d.]+ .?s).*?CPU µs/route (\d+)/(\d+)/(\d+), (\d+) fallbacks'),('open',r'open 5000/s\s+(\d+) routes/s, p50 ([\d.]+ ms) p99 ([\d.]+ ms), decide p99 ([\d.]+ .?s).*?CPU µs/route (\d+)/(\d+)/(\d+), (\d+) fallbacks')):
        m=re.search(pat,t)
        if m: rows.setdefault(b,{}).setdefault(kind,[]).append((int(i),m.groups()))
for b,d in rows.items():
    c=sorted(d['closed']); o=sorted(d['open'])
    print(b,'runs',[x[0] for x in c])
    print('  closed routes/s',[x[1][0] for x in c],'median',st.median(int(x[1][0]) for x in c))
    print('  closed leader/followers',[x[1][2]+'/'+x[1][3] for x in c],'med',st.median(int(x[1][2]) for x in c),st.median(int(x[1][3]) for x in c))
    print('  5k leader/followers',[x[1][4]+'/'+x[1][5] for x in o],'med',st.median(int(x[1][4]) for x in o),st.median(int(x[1][5]) for x in o), 'cluster med', st.median(int(x[1][4])+int(x[1][5]) for x in o))
    print('  5k p99',[x[1][2] for x in o],'decide',[x[1][3] for x in o],'fallbacks',[x[1][7] for x in o], 'med', st.median(int(x[1][7]) for x in o))
