"""The end of a tests/serve script's main: its unittest cases run against one shared `tern serve`, which is
stopped afterwards and must then exit 0 (a server that failed to drain or crashed fails the run too)."""
import sys
import unittest


def run_cases_against(server, unittest_args):
    """Runs this script's unittest cases (`unittest_args`: what the command line left for unittest), stops
    `server` (an object with stop(), proc and stderr_lines); the process exit code: 0 when every case passed
    and the server exited 0."""
    try:
        result = unittest.main(argv=[sys.argv[0], "-v", *unittest_args], exit=False).result
    finally:
        server.stop()
    code = server.proc.returncode
    if code != 0:
        print(f"tern serve exited {code} at the end:\n" + "".join(server.stderr_lines[-20:]), file=sys.stderr)
        return 1
    return 0 if result.wasSuccessful() else 1
