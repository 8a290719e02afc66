"""python3 -m memlab [run options] | check [run options] | predict RUNS_DIR [options]
(lab/memlab.sh runs it: the one command of the lab, docs/memlab.md)."""

import subprocess
import sys

from . import log, options


def main(argv):
    try:
        if argv[:1] == ["predict"]:
            from . import predict
            log.PROGRAM = "memlab predict"
            return predict.main(argv[1:])
        if "-h" in argv or "--help" in argv:
            sys.stdout.write(options.help_text())
            return 0
        if argv[:1] == ["check"]:  # the options checked, nothing done (lab/memlab.sh, before any root step)
            options.parse(argv[1:])
            return 0
        from . import runner
        return runner.main(argv)
    except log.LabError as e:
        print(f"{log.PROGRAM}: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"{log.PROGRAM}: {' '.join(map(str, e.cmd))} exited with {e.returncode}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
