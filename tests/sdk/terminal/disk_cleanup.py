"""`acme/disk-cleanup-v0` and its weak twin, as docs/authoring.md ("Adversaries") shows them:
delete the files of /data matching a per-task rule, keep the protected ones. The weak twin's
verifier only checks that the named files are gone, so `rm -rf /data/*` passes it; its author
adversary `wipe-data` (and the library hack `delete-everything`) shows that."""

import corral as cr
from corral.terminal import bash
from corral.verify import clean_exec

TASKS = [{"pattern": "*.log", "files": ["app.log", "db.log", "keep.log", "notes.txt"],
          "protected": ["keep.log"]},
         {"pattern": "*.tmp", "files": ["a.tmp", "b.tmp", "data.csv"], "protected": []}]


def doomed(task):
    """The files the agent must delete: those matching the rule, protected ones aside."""
    from fnmatch import fnmatch

    return [f for f in task.files if fnmatch(f, task.pattern) and f not in task.protected]


@cr.environment("acme/disk-cleanup-weak-v0", tasks=TASKS, max_turns=10)
class DiskCleanupWeak(cr.TerminalEnv):
    adversaries = [cr.Adversary("wipe-data", [bash("rm -rf /data/*")],
                                hint="check that the files to keep are still there")]

    async def setup(self, sandbox, task):
        for name in task.files:
            await sandbox.write_file(f"/data/{name}", f"{name}\n")

    def instruction(self, task):
        keep = ", ".join(task.protected) or "nothing"
        return (f"Delete every file in /data/ matching {task.pattern}, except the protected "
                f"ones ({keep}). Keep every other file.")

    @cr.reward(sandbox_only=True)
    async def cleaned(self, sandbox, task) -> float:
        gone = " && ".join(f"[ ! -e /data/{name} ]" for name in doomed(task))
        return float((await clean_exec(sandbox, gone, timeout=30)).ok)

    def solution(self, task):
        return [bash("cd /data && rm -f " + " ".join(doomed(task)))]


@cr.environment("acme/disk-cleanup-v0", tasks=TASKS, max_turns=10)
class DiskCleanup(DiskCleanupWeak):
    @cr.reward(sandbox_only=True)
    async def cleaned(self, sandbox, task) -> float:
        kept = [f"grep -qx {name} /data/{name}" for name in task.files
                if name not in doomed(task)]
        gone = [f"[ ! -e /data/{name} ]" for name in doomed(task)]
        return float((await clean_exec(sandbox, " && ".join(gone + kept), timeout=30)).ok)
