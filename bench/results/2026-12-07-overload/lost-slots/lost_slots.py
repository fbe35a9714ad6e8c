# For each calm request dispatched under the flood (cart's decision log at
# info level: its dispatch time and queued_ms), count the flood requests
# dispatched between its arrival in the queue and its own dispatch: slots
# the calm request lost to the flood while it waited. Then list, for each
# such case, when the calm tenant's previous request was dispatched, and
# the queued_ms of the flood requests that took the slots.
# Usage: python3 lost_slots.py cart.log.gz > lost_slots.txt
import gzip, sys
import re,datetime
def ts(l): return datetime.datetime.strptime(l[5:28],"%Y-%m-%dT%H:%M:%S.%f").timestamp()*1000
lines=[l for l in gzip.open(sys.argv[1], 'rt') if 'msg=route' in l]
ev=[]
for l in lines:
    t=ts(l); ten=re.search(r'tenant=(\S+)',l).group(1)
    q=re.search(r'queued_ms=(\d+)',l); q=int(q.group(1)) if q else 0
    w=re.search(r'worker=(\S+)',l).group(1)
    ev.append((t,ten,q,w))
fl=[e for e in ev if e[1]=='flood']
t0=fl[0][0]
calm=[e for e in ev if e[1]=='calm' and e[0]>t0+5000]
fd=sorted(e[0] for e in fl)
import bisect
lost=[]
for t,ten,q,w in calm:
    enq=t-q
    n=bisect.bisect_left(fd,t)-bisect.bisect_right(fd,enq)
    lost.append((n,q,t-t0))
import collections
print("calm",len(calm)); print(collections.Counter(min(x[0],5) for x in lost))
for n,q,t in sorted(lost,key=lambda x:-x[1])[:15]: print("queued %d ms, flood dispatches meanwhile %d, at %.0f"%(q,n,t))
print("---- lost-slot cases: previous calm dispatch before this one's dispatch")
cd=sorted(e[0] for e in calm)
allcalm=sorted(e for e in ev if e[1]=='calm')
for t,ten,q,w in calm:
    enq=t-q
    n=bisect.bisect_left(fd,t)-bisect.bisect_right(fd,enq)
    if n==0: continue
    # previous calm dispatch time
    i=bisect.bisect_left([e[0] for e in allcalm],t)
    prev=allcalm[i-1][0] if i>0 else None
    prevq=allcalm[i-1][2] if i>0 else None
    gap = t-prev if prev else -1
    print("q %3d ms lost %d | prev calm dispatched %.0f ms before (it waited %s ms) | prev-calm dispatch after my enqueue: %s"%(q,n,gap,prevq, prev is not None and prev>=enq))
print("---- flood dispatches during calm waits: their queued_ms")
fle=sorted(fl)
for t,ten,q,w in calm:
    enq=t-q
    mids=[f for f in fle if enq < f[0] < t]
    if mids: print("calm q %d:"%q, [(round(f[0]-enq), f[2], f[3][-5:]) for f in mids], "calm->", w[-5:])
