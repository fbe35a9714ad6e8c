import sys, collections, re
# reads `perf script -F comm,pid,ip,sym` output; prints inclusive % per symbol (top N) for a pid
pid = sys.argv[2]; path = sys.argv[1]
incl = collections.Counter(); self_ = collections.Counter(); total = 0
cur = None; frames = []
def flush():
    global total
    if cur == pid and frames:
        total += 1
        self_[frames[0]] += 1
        for f in set(frames): incl[f] += 1
for line in open(path, errors='replace'):
    if not line.strip():
        flush(); cur=None; frames=[]; continue
    if not line.startswith((' ','\t')):
        parts = line.split(); cur = parts[1] if len(parts)>1 else None; frames=[]; continue
    p = line.split(None,1)
    sym = p[1].strip() if len(p)>1 else '?'
    sym = re.sub(r'\+0x[0-9a-f]+$','',sym)
    sym = re.sub(r'\s*\(.*\)$','',sym)
    frames.append(sym)
flush()
print('samples', total)
for k,v in incl.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 70):
    print('%5.1f%% incl %5.1f%% self  %s' % (100*v/total, 100*self_[k]/total, k[:150]))
