# The fixture runs of lab/tests/test_predict.py, made once with this script; expected/N.out is what
# the former scripts/memlab-predict.sh (commit 5181162) printed for the Nth case of the test, with
# fake-moe-residency standing in for moe-residency lab-predict.
import os, random
R = random.Random(50)
def w(p, t):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f: f.write(t)
MET = "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms\n"
def metrics(p, ms):
    w(p, MET + "".join("%d,8,%.3f,1.0,100,,1.0,1,1.0,0.1\n" % (i, ms * R.uniform(0.8, 1.2)) for i in range(1, 9)))
for run, drift in (("20261201-000000-quick", 1.0), ("20261202-000000-quick", 1.2)):
    d = f"lab/runs/{run}"
    w(f"{d}/table.txt", "memlab (quick): model.gguf, 1408 MiB; 8 prompt + 16 decode tokens, 2 threads (OMP_WAIT_POLICY=PASSIVE); x\n")
    w(f"{d}/disk-lanes.csv", "readers,reads,mib,seconds,mib_per_s\n1,64,256,0.3,%.1f\n2,64,256,0.2,%.1f\n" % (900 * drift, 1300 / drift))
    w(f"{d}/fault-walk.csv", "limit_mib,pinned_dense_mib\n939,0\n")
    w(f"{d}/inline-walk.csv", "limit_mib,budget_mib\n939,235\n")
    for r in ("1.5", "2.5"):
        w(f"{d}/r{r}-observer.log", f"moe-predict: stale-gate {92 + float(r):.1f}% of routed slots (56.2% whole)\n")
        for c, ms in (("observer", 700), ("exact", 120), ("cache", 150), ("all", 90), ("degraded", 100), ("all-pool", 80)):
            ok = not (c == "cache" and r == "1.5" and drift > 1)
            w(f"{d}/r{r}-{c}.status", "ok\n" if ok else "killed\n")
            if ok: metrics(f"{d}/r{r}-{c}.metrics.csv", ms * drift * (1.5 if r == "2.5" else 1))
            if c == "observer": w(f"{d}/r{r}-{c}.route.csv", "# route_trace v1\n")
    for n in ("resident", "resident-all", "manager-exact", "manager-cache"):
        w(f"{d}/{n}.status", "ok\n"); metrics(f"{d}/{n}.metrics.csv", 15)
        for r in ("1.5", "2.5"):
            w(f"{d}/r{r}-{n}.status", "ok\n"); metrics(f"{d}/r{r}-{n}.metrics.csv", 15)
    w(f"{d}/manager-cache.log", "residency: dense 0 | cache lru 235.0 MiB 23.24% hit\n")
