"""The ib_write_bw stand-in (tests/standins/bin/ib_write_bw) on this machine, no node.

SPARK_SIM_ROOT points it at a temporary directory shaped by the RoCE stand-in's own tree builder
(lib/roce_sysfs.py, as tests/unit/test_roce_standin.py drives it); server and client meet over TCP
on 127.0.0.1 with a free port. Each run traps the resolvers of Python's socket module: the stand-in
must answer without asking one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROCE_SYSFS = REPO / "tests" / "standins" / "lib" / "roce_sysfs.py"
IB_WRITE_BW = REPO / "tests" / "standins" / "bin" / "ib_write_bw"
HCA, NETDEV = "rocep1s0f1", "enp1s0f1np1"
ARGS = ["-d", HCA, "-i", "1", "-x", "3", "-F", "--report_gbits", "-D", "5"]
# Runs the stand-in with every resolver of the socket module replaced by a trap.
TRAPPED = """
import runpy, socket, sys
def trap(*a, **k):
    raise SystemExit("resolver called: %r" % (a,))
for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "getfqdn"):
    setattr(socket, name, trap)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture
def roce(tmp_path, monkeypatch):
    """The RoCE stand-in's tree builder, its tree written under tmp_path: an HCA whose netdev has
    10.232.1.10 (GID 3: that address's RoCE v2 entry) and MTU 9000."""
    monkeypatch.setenv("SPARK_SIM_ROOT", str(tmp_path))
    spec = importlib.util.spec_from_file_location("roce_sysfs_for_ib_write_bw", ROCE_SYSFS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    netdev = {"ifname": NETDEV, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 9000,
              "address": "56:fa:89:b0:3d:62", "addr_info": [{"family": "inet", "local": "10.232.1.10"}]}
    monkeypatch.setattr(mod, "netdev_info", {NETDEV: netdev}.get)
    (tmp_path / f"sys/class/net/{NETDEV}").mkdir(parents=True)
    (tmp_path / f"sys/class/net/{NETDEV}/mtu").write_text("9000\n")
    mod.expose_sys_class()

    mod.build = lambda **knobs: mod.Driver(mod.knobs({"roce": knobs})).sync()
    mod.build()
    return mod


@pytest.fixture
def root(roce, tmp_path):
    return tmp_path


def set_knobs(root: Path, **roce) -> None:
    (root / "etc/spark-sim").mkdir(parents=True, exist_ok=True)
    (root / "etc/spark-sim/node.json").write_text(json.dumps({"roce": roce}))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args) -> list[str]:
    return [sys.executable, "-c", TRAPPED, str(IB_WRITE_BW), *map(str, args)]


def env(root: Path) -> dict:
    return dict(os.environ, SPARK_SIM_ROOT=str(root))


def run(root: Path, *args, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), capture_output=True, text=True, env=env(root), timeout=timeout)


def start_server(root: Path, *args) -> subprocess.Popen:
    server = subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(root))
    port = int(args[args.index("-p") + 1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # listening: a probe connection would be its one client, so look instead
        with open("/proc/net/tcp") as f:
            if any(f":{port:04X} 00000000:0000 0A" in line for line in f):
                return server
        time.sleep(0.02)
    server.kill()
    raise AssertionError(f"server never listened: {server.communicate()}")


def report_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    head = lines.index(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
    return lines[head:head + 3]


def test_server_and_client_print_the_table_with_the_knob(root):
    set_knobs(root, write_bw_gbps=97.5, write_bw_seconds_cap=0.05)
    port = free_port()
    server = start_server(root, *ARGS, "-p", port)
    client = run(root, *ARGS, "-p", port, "127.0.0.1")
    s_out, s_err = server.communicate(timeout=30)
    assert (client.returncode, client.stderr) == (0, "")
    assert (server.returncode, s_err) == (0, "")
    assert s_out.startswith(" WARNING: BW peak won't be measured in this run.\n\n"
                            "************************************\n* Waiting for client to connect... *\n")
    for out in (client.stdout, s_out):
        assert "                    RDMA_Write BW Test\n" in out
        assert " Dual-port       : OFF\t\tDevice         : rocep1s0f1\n" in out
        assert " Mtu             : 4096[B]\n Link type       : Ethernet\n GID index       : 3\n" in out
        assert out.count(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:232:01:10\n") == 2
        # -D: completions counted over duration - 2*(duration/4) = 3 s, by 100; no peak.
        assert report_lines(out)[1:] == [" 65536      557800           0.00               97.50  \t\t     0.185966",
                                         "-" * 87]
    assert " TX depth        : 128\n" in client.stdout and "TX depth" not in s_out
    # Each side prints the other's QP as the remote one.
    local = [line for line in client.stdout.splitlines() if line.startswith(" local address:")][0]
    assert local.replace("local", "remote") in s_out
    assert "LID 0000 QPN 0x" in local


def test_unknown_device(root):
    r = run(root, "-d", "mlx5_9", *ARGS[2:], "-p", free_port())
    assert r.returncode == 1
    assert r.stderr == "IB device mlx5_9 not found\n Unable to find the Infiniband/RoCE device\n"


def test_port_down(roce, root):
    roce.build(port_state="DOWN")
    r = run(root, *ARGS, "-p", free_port())
    assert r.returncode == 1
    assert r.stderr == (" Port number 1 state is Down\n Couldn't set the link layer\n"
                        " Couldn't get context for the device\n")
    assert "Waiting for client" not in r.stdout


def test_unused_gid_index_fails_both_sides_after_the_exchange(root):
    set_knobs(root, write_bw_seconds_cap=0)
    port = free_port()
    server = start_server(root, *ARGS, "-p", port)
    client = run(root, *[a if a != "3" else "7" for a in ARGS], "-p", port, "127.0.0.1")
    s_out, s_err = server.communicate(timeout=30)
    incompatible = "\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n\n"
    assert (client.returncode, client.stderr) == (1, incompatible)
    assert " GID index       : 7\n" in client.stdout and "local address" not in client.stdout
    assert (server.returncode, s_err) == (1, incompatible)


def test_no_server_refused_at_once(root):
    start = time.monotonic()
    r = run(root, *ARGS, "-p", free_port(), "127.0.0.1")
    assert r.returncode == 1
    assert r.stderr == (f"Couldn't connect to 127.0.0.1:{r.args[-2]}\n"
                        "Unable to open file descriptor for socket connection\n Unable to init the socket connection\n")
    assert time.monotonic() - start < 5  # perftest tries once outside rdma_cm


def test_a_name_is_not_resolved(root):
    r = run(root, *ARGS, "-p", "18515", "spark-1")
    assert r.returncode == 1
    assert r.stderr == ("Name or service not known for ai_family: 2 service: spark-1 port: 18515\n"
                        "Problem in resolving basic address and port\n"
                        "Unable to open file descriptor for socket connection\n Unable to init the socket connection\n")


def test_server_cannot_listen_on_a_port_in_use(root):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("0.0.0.0", 0))  # noqa: S104 - the stand-in binds every address, as perftest does
        busy.listen(1)
        r = run(root, *ARGS, "-p", busy.getsockname()[1])
    assert r.returncode == 1
    assert r.stderr == (f"Couldn't listen to port {r.args[-1]}\n"
                        "Unable to open file descriptor for socket connection\n Unable to init the socket connection\n")


def test_options_like_perftest(root):
    r = run(root, "-h")
    assert r.returncode == 1 and r.stdout.startswith("Usage:\n  ib_write_bw            start a server")
    r = run(root, "-x", "65")
    assert (r.returncode, r.stderr) == (1, " Gid index should be between 0 and 64\n Parser function exited with Error\n")
    r = run(root, "-G")
    assert r.returncode == 1 and r.stderr.startswith("ib_write_bw: invalid option -- 'G'\n Invalid Command or flag.\n")
    r = run(root, "-q", "2")
    assert r.returncode == 2 and "-q is not stood in" in r.stderr
