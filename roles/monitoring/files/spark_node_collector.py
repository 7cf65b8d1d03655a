#!/usr/bin/python3
"""The node collector of the monitoring role: what the node exporter cannot read, as a textfile.

Run by spark-llm-monitoring-collector.timer every few seconds (as root: the supervisor's state is 0600),
it writes <textfile dir>/spark_node.prom atomically (a temporary file renamed over it), which the node
exporter's textfile collector serves:

- the GPU, from `nvidia-smi --query-gpu` in CSV: utilisation, temperature, power, clocks, and memory
  where the GPU reports it. A GB10 shares its memory with the CPU and answers "[N/A]" for the memory
  figures (and for other fields it has no sensor for): such a field gets no sample, and
  spark_gpu_field_supported{field=...} says so (0), so a panel can tell "no data" from "not measured".
  A field the driver does not know at all (exit 2, "... is not a valid field to query") is dropped and
  the query asked again without it.
- the processes holding the GPU (`--query-compute-apps`), and whether one of them is the rank's
  (its command line names the engine, --rank-process: sglang, or vllm; either case, as the engines' process
  titles write it);
- free and total bytes of the model directory's filesystem and of the root filesystem (statvfs: no
  guess of which mount holds the directory; a directory that does not exist yet is measured at its
  nearest existing parent, where it will be);
- on the head, the group supervisor's state (state.json in its state directory): its state, the
  failed generation probes in a row, the restarts in its window, whether it gave up;
- every RDMA port (/sys/class/infiniband): whether it is ACTIVE, and how many ports behind the fabric
  interface NCCL can use (ACTIVE, with a RoCE v2 GID for an IPv4 address of the port). NCCL without one
  does not fail, it falls back to its socket transport: the figure is the only sign while the group serves.

Every run also writes spark_collector_last_run_timestamp_seconds: an alert tells a collector that
stopped from figures that stopped changing. Standard library only.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import subprocess
import sys
import tempfile
import time

GPU_FIELDS = [
    ("index", None), ("uuid", None), ("name", None), ("driver_version", None),
    ("utilization.gpu", ("spark_gpu_utilization_percent", "GPU utilisation, percent.", 1.0)),
    ("utilization.memory", ("spark_gpu_memory_utilization_percent", "Memory controller utilisation, percent.", 1.0)),
    ("temperature.gpu", ("spark_gpu_temperature_celsius", "GPU temperature, degrees Celsius.", 1.0)),
    ("power.draw", ("spark_gpu_power_draw_watts", "GPU power draw, watts.", 1.0)),
    ("power.limit", ("spark_gpu_power_limit_watts", "GPU power limit, watts.", 1.0)),
    ("clocks.sm", ("spark_gpu_sm_clock_hertz", "SM clock, hertz.", 1e6)),
    ("clocks.mem", ("spark_gpu_memory_clock_hertz", "Memory clock, hertz.", 1e6)),
    ("memory.used", ("spark_gpu_memory_used_bytes", "GPU memory used, bytes.", 1024 * 1024)),
    ("memory.total", ("spark_gpu_memory_total_bytes", "GPU memory total, bytes.", 1024 * 1024)),
]
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
SUPERVISOR_STATES = ("healthy", "probing-failed", "restarting", "waiting-for-node", "stopped", "paused", "gave-up")


def escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    def __init__(self):
        self.families = {}

    def add(self, name, help_text, value, labels=None, kind="gauge"):
        family = self.families.setdefault(name, {"help": help_text, "kind": kind, "samples": []})
        family["samples"].append((labels or {}, value))

    def text(self):
        out = []
        for name, family in self.families.items():
            out += [f"# HELP {name} {family['help']}", f"# TYPE {name} {family['kind']}"]
            for labels, value in family["samples"]:
                shown = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
                out.append(f"{name}{{{shown}}} {float(value)!r}" if shown else f"{name} {float(value)!r}")
        return "\n".join(out) + "\n"


def run(argv, timeout=20):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 127, "", str(err)
    return proc.returncode, proc.stdout, proc.stderr


def query_gpus(nvidia_smi):
    """(rows, unsupported fields, error): one dict per GPU of the fields the driver knows."""
    fields = [name for name, dummy in GPU_FIELDS]
    unknown = []
    while fields:
        rc, out, err = run([nvidia_smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
        text = (out + err).strip()
        if rc == 2 and "is not a valid field to query" in text:
            bad = text.split('"')[1] if text.count('"') >= 2 else ""
            if bad in fields and bad not in ("index", "uuid"):
                fields.remove(bad)
                unknown.append(bad)
                continue
        if rc != 0:
            return [], unknown, text.splitlines()[0] if text else f"nvidia-smi exited {rc}"
        rows = []
        for line in out.splitlines():
            values = [v.strip() for v in line.split(",")]
            if len(values) == len(fields):
                rows.append(dict(zip(fields, values, strict=True)))
        return rows, unknown, ""
    return [], unknown, "no field left to query"


def rank_processes(nvidia_smi, process):
    """(count of GPU processes per GPU uuid, whether one is the rank's)."""
    rc, out, dummy = run([nvidia_smi, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"])
    per_gpu, rank = {}, False
    if rc != 0:
        return per_gpu, None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        per_gpu[parts[1]] = per_gpu.get(parts[1], 0) + 1
        try:
            with open(f"/proc/{parts[0]}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rank = rank or process.lower() in cmdline.lower()
    return per_gpu, rank


def gpu_metrics(expo, nvidia_smi, process):
    rows, unknown, error = query_gpus(nvidia_smi)
    expo.add("spark_gpu_query_success", "1 when nvidia-smi answered the GPU query.", 0 if error else 1)
    if error:
        expo.add("spark_gpu_query_error", "The first line nvidia-smi printed when it failed.", 1, {"error": error[:200]})
    per_gpu, rank = rank_processes(nvidia_smi, process)
    for row in rows:
        gpu = {"gpu": row.get("index", "?")}
        expo.add("spark_gpu_info", "The GPU, its name, UUID and driver.", 1,
                 {**gpu, "uuid": row.get("uuid", ""), "name": row.get("name", ""),
                  "driver_version": row.get("driver_version", "")})
        for field, spec in GPU_FIELDS:
            if spec is None:
                continue
            name, help_text, scale = spec
            raw = row.get(field)
            supported = raw is not None and raw not in NOT_AVAILABLE
            value = None
            if supported:
                try:
                    value = float(raw) * scale
                except ValueError:
                    supported = False
            expo.add("spark_gpu_field_supported",
                     "1 when the GPU reports the field; 0 for [N/A] (a GB10's memory figures) or a field the driver "
                     "does not know.", 1 if supported else 0, {**gpu, "field": field})
            if supported:
                expo.add(name, help_text, value, gpu)
        expo.add("spark_gpu_compute_processes", "Processes holding the GPU (nvidia-smi --query-compute-apps).",
                 per_gpu.get(row.get("uuid", ""), 0), gpu)
    for field in unknown:
        expo.add("spark_gpu_field_supported", "1 when the GPU reports the field; 0 for [N/A] (a GB10's memory "
                 "figures) or a field the driver does not know.", 0, {"gpu": "all", "field": field})
    if rank is not None:
        expo.add("spark_rank_process_present", "1 when a process holding the GPU is the SGLang rank's.", int(rank))


def measured_at(path):
    """The path itself, or its nearest existing parent (where a directory still to be created will be)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def filesystem_metrics(expo, purpose, path):
    at = measured_at(path)
    try:
        st = os.statvfs(at)
    except OSError:
        return
    labels = {"purpose": purpose, "path": path}
    expo.add("spark_filesystem_avail_bytes", "Bytes available to unprivileged users on the filesystem holding path.",
             st.f_bavail * st.f_frsize, labels)
    expo.add("spark_filesystem_size_bytes", "Size in bytes of the filesystem holding path.",
             st.f_blocks * st.f_frsize, labels)


def supervisor_metrics(expo, state_dir):
    path = os.path.join(state_dir, "state.json")
    try:
        with open(path) as f:
            st = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        st = {}
    state = st.get("state") if isinstance(st, dict) else None
    for name in SUPERVISOR_STATES:
        expo.add("spark_supervisor_state", "The group supervisor's state (1 for the current one).",
                 int(state == name), {"state": name})
    expo.add("spark_supervisor_probe_failures", "Failed generation probes in a row while every rank is active.",
             int(st.get("failures") or 0) if isinstance(st, dict) else 0)
    expo.add("spark_supervisor_restarts", "Group restarts the supervisor counts in its window.",
             len(st.get("restarts") or []) if isinstance(st, dict) else 0)
    expo.add("spark_supervisor_gave_up", "1 when the supervisor gave up (gave-up.json).",
             int(os.path.exists(os.path.join(state_dir, "gave-up.json"))))
    # The supervisor's flapping alert holds for a window after it was raised (state.json's flapping_until).
    until = _epoch(st.get("flapping_until")) if isinstance(st, dict) and st.get("flapping_until") else None
    expo.add("spark_supervisor_flapping",
             "1 while the supervisor's alert of frequent group restarts (each healed) holds, for a window after it.",
             int(until is not None and time.time() < until))


def _epoch(stamp):
    try:
        return calendar.timegm(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def fabric_record_metrics(expo, path):
    """The fabric proof's last figures (the head's record): RDMA write per rail, the group's all-reduce."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return
    if not isinstance(record, dict):
        return
    rdma = record.get("rdma_write") or {}
    members = record.get("members") or [""]
    for pair in rdma.get("pairs") or []:
        if pair.get("gbits_per_second") is not None:
            # A record from before every pair was measured names the head's device and the worker: the head measured.
            expo.add("spark_fabric_rdma_write_gbits_per_second",
                     "RDMA write bandwidth the fabric proof last measured between a pair of the group's nodes, per rail.",
                     pair["gbits_per_second"], {"rail": pair.get("rail") or "",
                                                "node": pair.get("from") or members[0] or "",
                                                "device": pair.get("from_hca") or pair.get("head_hca") or "",
                                                "peer": pair.get("to") or pair.get("worker") or ""})
    ar = record.get("all_reduce") or {}
    if ar.get("busbw_gbytes_per_second") is not None:
        expo.add("spark_fabric_all_reduce_busbw_gbytes_per_second",
                 "All-reduce bus bandwidth across the group the fabric proof last measured (nccl-tests), by the "
                 "network NCCL used (IB, or Socket where it fell back).",
                 ar["busbw_gbytes_per_second"], {"network": ar.get("network") or ""})
    for what, section in (("rdma_write", rdma), ("all_reduce", ar)):
        when = _epoch(section.get("time")) if section else None
        if when is not None:
            expo.add("spark_fabric_measured_timestamp_seconds", "When the fabric proof last measured (Unix time).",
                     when, {"measurement": what})


def _sysfs(path):
    """A sysfs attribute without its numeric prefix ("4: ACTIVE" -> "ACTIVE"); None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip().split(": ", 1)[-1]
    except OSError:
        return None


def _roce_v2_ipv4(port_dir, netdev):
    """Whether the port's GID table holds a RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d) on netdev."""
    try:
        indexes = os.listdir(os.path.join(port_dir, "gids"))
    except OSError:
        return False
    for index in indexes:
        gid = (_sysfs(os.path.join(port_dir, "gids", index)) or "").lower()
        if (gid.startswith("0000:0000:0000:0000:0000:ffff:")
                and _sysfs(os.path.join(port_dir, "gid_attrs", "types", index)) == "RoCE v2"
                and _sysfs(os.path.join(port_dir, "gid_attrs", "ndevs", index)) in (netdev, "")):
            return True
    return False


def rdma_metrics(expo, rdma_class, rails):
    try:
        devices = sorted(os.listdir(rdma_class))
    except OSError:
        devices = []
    usable = dict.fromkeys(rails, 0)
    for device in devices:
        base = os.path.join(rdma_class, device)
        try:
            netdevs = sorted(os.listdir(os.path.join(base, "device", "net")))
            ports = sorted(os.listdir(os.path.join(base, "ports")))
        except OSError:
            continue
        for port in ports:
            port_dir = os.path.join(base, "ports", port)
            active = _sysfs(os.path.join(port_dir, "state")) == "ACTIVE"
            for netdev in netdevs:
                expo.add("spark_rdma_port_active", "1 when the RDMA port is ACTIVE.", int(active),
                         {"device": device, "port": port, "netdev": netdev})
                if netdev in usable and active and _roce_v2_ipv4(port_dir, netdev):
                    usable[netdev] += 1
    for netdev, count in usable.items():
        expo.add("spark_rdma_fabric_ports_usable",
                 "RDMA ports behind each fabric rail NCCL can use (ACTIVE, a RoCE v2 GID of an IPv4 address); 0 on "
                 "every rail: NCCL falls back to its socket transport.", count, {"netdev": netdev})


def write_atomically(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--textfile-dir", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--supervisor-state-dir", default="")
    p.add_argument("--fabric-interface", action="append", default=[],
                   help="a fabric rail's port, whose RDMA ports are counted (repeated: one per rail; none: not counted)")
    p.add_argument("--rdma-class", default="/sys/class/infiniband")
    p.add_argument("--fabric-record", default="", help="the fabric proof's record of its last figures (the head's)")
    p.add_argument("--rank-process", default="sglang", help="a word of the rank's command line: the engine's name")
    p.add_argument("--no-gpu", action="store_true", help="a node without the rank's GPU (the monitoring host)")
    p.add_argument("--stdout", action="store_true", help="print instead of writing the textfile")
    args = p.parse_args(argv)
    expo = Exposition()
    if not args.no_gpu:
        gpu_metrics(expo, args.nvidia_smi, args.rank_process)
    filesystem_metrics(expo, "model", args.model_dir)
    filesystem_metrics(expo, "root", "/")
    if args.supervisor_state_dir:
        supervisor_metrics(expo, args.supervisor_state_dir)
    if args.fabric_interface:
        rdma_metrics(expo, args.rdma_class, args.fabric_interface)
    if args.fabric_record:
        fabric_record_metrics(expo, args.fabric_record)
    expo.add("spark_collector_last_run_timestamp_seconds", "When the node collector last ran (Unix time).", time.time())
    if args.stdout:
        sys.stdout.write(expo.text())
    else:
        write_atomically(args.textfile_dir, "spark_node.prom", expo.text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
