# The fixture run directories of lab/tests (run-one, run-rounds), made once with this script;
# expected/ holds what the former scripts/memlab.sh (commit 5181162) printed and pooled for them.
import os, random
R = random.Random(20261207)
HDR = "token,phase,wall_ms,majflt,minflt,read_bytes,prefetch_issued,prefetch_useful,prefetch_late,pinned_mib,hit_pct,engine_majflt,proc_cpu_ms,proc_sys_ms,read_wait_ms,read_waits"
def per_token(path, n, base_ms, read_mib, managed, hits=True):
    lines = [HDR]
    pinned = 0.0
    for t in range(n + 1):
        phase = "prompt" if t == 0 else "decode"
        ms = base_ms * (3 if t == 0 else 1) * R.uniform(0.7, 1.4)
        majflt = R.randint(0, 120)
        rb = int(read_mib * 1048576 * R.uniform(0.5, 1.5))
        pinned = max(pinned, R.uniform(50, 260)) if managed else 0.0
        hit = ("%.2f" % R.uniform(10, 60)) if managed and hits and (t % 5 != 3) else ""
        lines.append("%d,%s,%.3f,%d,%d,%d,%d,%d,%d,%.1f,%s,%d,%.3f,%.3f,%.3f,%d" % (
            t, phase, ms, majflt, R.randint(100, 9000), rb, R.randint(0, 200) if managed else 0,
            R.randint(0, 30) if managed else 0, R.randint(0, 9) if managed else 0, pinned, hit,
            R.randint(0, majflt), ms * R.uniform(0.3, 1.9), ms * R.uniform(0.1, 0.9),
            R.uniform(0, 3) if managed else 0.0, R.randint(0, 12) if managed else 0))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
def log(path, digest):
    with open(path, "w") as f:
        f.write("load: adding 512 dummy tokens\n")
        if digest:
            f.write("moe-predict: stale-gate 93.9% of routed slots (56.2% whole routings) | prev-token 6.5% (0.0%)\n")
            f.write(f"logits: fnv1a64 {digest} over 16 tokens\n")
def small(path, text):
    with open(path, "w") as f:
        f.write(text + "\n")
def cell(d, name, status, n=16, ms=80.0, mib=50.0, managed=True, digest="a82bf53b38223851", peak="563", hits=True):
    small(os.path.join(d, name + ".status"), status)
    small(os.path.join(d, name + ".peak"), peak)
    log(os.path.join(d, name + ".log"), digest)
    if status == "ok":
        per_token(os.path.join(d, name + ".csv"), n, ms, mib, managed, hits)
def disk(d, best):
    small(os.path.join(d, "disk-expert.csv"), "readers,reads,mib,seconds,mib_per_s\n1,256,72.0,0.123,586.8\n2,256,72.0,0.101,%.1f\n4,256,72.0,0.055,1318.6\n8,256,72.0,0.053,1370.6" % best)

# One round, two ratios: finished, killed, a digest that differs, one without a digest,
# a manager run without any hit, runs without a limit (made once, copied per ratio).
d = "run-one"; os.makedirs(d, exist_ok=True)
disk(d, 715.0)
cell(d, "r1.5-mmap", "ok", ms=1100, mib=1200, managed=False)
cell(d, "r1.5-all", "ok", ms=90, mib=60)
cell(d, "r1.5-cache", "killed")
cell(d, "r2.5-mmap", "ok", ms=1200, mib=1233, managed=False)
cell(d, "r2.5-all", "ok", ms=81, mib=56, digest="ffffffffffffffff")
cell(d, "r2.5-cache", "ok", ms=120, mib=80, hits=False)
cell(d, "r2.5-degraded", "timeout")
cell(d, "r1.5-observer", "ok", ms=700, mib=900, managed=False, digest="")
cell(d, "resident", "ok", ms=15, mib=0.0, managed=False, peak="-")
cell(d, "manager-exact", "ok", ms=17, mib=0.0)

# Two rounds (the second reversed), one ratio: pooled tokens; a cell whose second round
# failed; a cell whose digests differ between rounds; curves in each round.
d = "run-rounds"; os.makedirs(d, exist_ok=True)
for k, best in ((1, 1300.5), (2, 1410.25)):
    r = os.path.join(d, f"round-{k}"); os.makedirs(r, exist_ok=True)
    disk(r, best)
    cell(r, "r2-mmap", "ok", n=12, ms=900, mib=800, managed=False, peak=str(500 + k))
    cell(r, "r2-all", "ok", n=12, ms=70, mib=40, peak=str(512 - k))
    cell(r, "r2-all-serial", "ok" if k == 1 else "failed", n=12, ms=95, mib=42)
    cell(r, "r2-all-pool", "ok", n=12, ms=60, mib=35, digest="a82bf53b38223851" if k == 1 else "0123456789abcdef")
