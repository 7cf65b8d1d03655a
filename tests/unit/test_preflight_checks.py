"""Preflight's check table, evaluated by its filter against synthetic probe results, without nodes.

The probe results have the shapes the role's tasks register (command, systemd_service, slurp,
find), for a DGX Spark node that is fine unless a test plants one fault. The expected messages
are written out here, as an operator reads them in the summary, not read from the table: a test
that compared the table with itself could not fail. tests/integration/test_preflight*.py run
the same table through the playbook on simulated nodes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from tests.lib.roles import filter_plugin

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "preflight"


class _Loader(yaml.SafeLoader):
    """Ansible YAML: `!unsafe` marks a plain string."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))

preflight = filter_plugin("preflight")
CHECKS = yaml.load((ROLE / "vars" / "main.yml").read_text(), Loader=_Loader)["__preflight_checks"]  # noqa: S506 - SafeLoader

UNIT = "spark-llm.service"
CONTAINER_ID = "5bd1e0c2" * 8
MIB = 1024 * 1024
SETTINGS = {
    "preflight_expected_arch": "aarch64",
    "preflight_distributions": {"Ubuntu": "24.04"},
    "preflight_gpu_count": 1,
    "preflight_gpu_name": "NVIDIA GB10",
    "preflight_gpu_compute_cap": "12.1",
    "preflight_gpu_driver_min": "580.95.05",
    "preflight_gpu_allowed_processes": [],
    "preflight_server_unit": UNIT,
    "preflight_docker_runtime": "nvidia",
    "preflight_memory_available_min_mib": 102400,
    "preflight_swap_fatal": False,
    "preflight_roce_broken_kernels": {"7.0.0-1019-nvidia": "NCCL's ibv_reg_mr_iova2 fails with ENOMEM at init"},
    "preflight_model_dir": "/opt/models/glm53",
    "preflight_checkpoint_bytes": 48 * MIB,
    "preflight_checkpoint_repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
    "preflight_disk_headroom_bytes": 8 * MIB,
    "preflight_fabric_interfaces": ["enp1s0f1np1"],
}
GB10 = "0, NVIDIA GB10, 12.1, 580.95.05"
RUNTIMES = {"io.containerd.runc.v2": {"path": "runc"}, "nvidia": {"path": "nvidia-container-runtime"},
            "runc": {"path": "runc"}}
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
             "NVIDIA driver is installed and running.")
NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def command(rc=0, stdout="", stderr=""):
    """What ansible.builtin.command registers."""
    return {"changed": False, "rc": rc, "stdout": stdout, "stderr": stderr,
            "stdout_lines": stdout.splitlines(), "stderr_lines": stderr.splitlines()}


def gpu_probe(rows=(GB10,), apps=(), cgroups=None, *, rc=0, stdout=None, stderr=""):
    """The GPU probe's output: nvidia-smi's GPU rows, '--- apps' and its rows, then each process's cgroup file."""
    if rc != 0:
        return command(rc, stdout or "", stderr)
    text = "".join(f"{row}\n" for row in rows) + "--- apps\n" + "".join(f"{pid}, {name}\n" for pid, name in apps)
    for pid, lines in (cgroups or {}).items():
        text += f"--- gone {pid}\n" if lines is None else f"--- cgroup {pid}\n" + "".join(f"{line}\n" for line in lines)
    return command(0, text.rstrip("\n"))


def docker_probe(runtimes=None, container_id="", *, rc=0, stderr=""):
    if rc != 0:
        return command(rc, "", stderr)
    return command(0, json.dumps(RUNTIMES if runtimes is None else runtimes) + "\n--- container\n" + container_id)


def unit_probe(active=False, cgroup=""):
    """What ansible.builtin.systemd_service registers (its status: `systemctl show` as a dict)."""
    status = {"LoadState": "loaded", "ActiveState": "active" if active else "inactive",
              "SubState": "running" if active else "dead", "ControlGroup": cgroup}
    return {"changed": False, "name": UNIT, "status": status}


def meminfo_probe(available_mib=120 * 1024, swap_mib=0, cma_kib=None):
    """/proc/meminfo; cma_kib: (CmaTotal, CmaFree), as a kernel built with CMA adds them."""
    text = (f"MemTotal:       127543296 kB\nMemFree:         1000000 kB\nMemAvailable:   {available_mib * 1024} kB\n"
            f"SwapCached:            0 kB\nSwapTotal:      {swap_mib * 1024} kB\nSwapFree:       {swap_mib * 1024} kB\n")
    if cma_kib is not None:
        text += f"CmaTotal:       {cma_kib[0]:>9} kB\nCmaFree:        {cma_kib[1]:>9} kB\n"
    return {"changed": False, "content": base64.b64encode(text.encode()).decode(), "encoding": "base64",
            "source": "/proc/meminfo"}


def disk_probe(avail=500 * 1024 * MIB, mount="/", present=0, *, rc=0, stderr=""):
    """df's header and filesystem line, then the bytes already in the model directory."""
    if rc != 0:
        return command(rc, f"     Avail Mounted on\n{avail:>10} {mount}", stderr)
    return command(0, f"     Avail Mounted on\n{avail:>10} {mount}\n{present}")


# Records beside the model directory, as the probe reads them.
SEED = {"dir": "/opt/models/glm53-seed", "repo_id": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "revision": "a" * 40,
        "bytes": 48 * MIB, "verified": True}
ALT = {"dir": "/opt/models/glm53-alt", "repo_id": "SparkSite/GLM-5.3-Flash-NVFP4-alt", "revision": "b" * 40,
       "bytes": 48 * MIB, "verified": True}

UP_NO_CARRIER = {"enp1s0f1np1": {"up": True, "carrier": False, "operstate": "down"}}


def netdevs_probe(names=("lo", "enp1s0f0np0", "enp1s0f1np1")):
    """What ansible.builtin.find registers for /sys/class/net."""
    files = [{"path": f"/sys/class/net/{name}", "islnk": name != "bonding_masters"} for name in names]
    return {"changed": False, "files": files, "matched": len(files), "examined": len(files)}


# What the probe's fact collectors give on a good node (platform, command line, distribution), the part the table reads.
GOOD_FACTS = {"architecture": "aarch64", "distribution": "Ubuntu", "distribution_version": "24.04",
              "kernel": "6.17.0-1032-nvidia", "proc_cmdline": {"ro": True, "quiet": True}}


def probes(**changes):
    """A good DGX Spark node's probe results, with the given ones replaced."""
    result = {
        "facts": dict(GOOD_FACTS),
        "unit": unit_probe(),
        "container": {"name": "spark-llm", "id": ""},
        "gpu": gpu_probe(),
        "docker": docker_probe(),
        "meminfo": meminfo_probe(),
        "disk": disk_probe(),
        "netdevs": netdevs_probe(),
    }
    result.update(changes)
    return result


def findings(node=None, **settings):
    return preflight.preflight_findings(node or probes(), CHECKS, {**SETTINGS, **settings})


def rows(node=None, **settings):
    """(severity, check, problem, fix) of every finding, in the summary's order."""
    return [(f["severity"], f["check"], f["problem"], f["fix"]) for f in findings(node, **settings)]


# Serving node: the unit is active, its rank's processes are in its cgroup or its container's scope.
SERVING = {"unit": unit_probe(active=True, cgroup=f"/system.slice/{UNIT}"),
           "container": {"name": "spark-llm", "id": CONTAINER_ID}}

FIX = {
    "arch": ("Point the inventory at the DGX Spark nodes (the SGLang image is arm64 only); a site with other "
             "hardware sets preflight_expected_arch."),
    "os": "Install DGX OS (or Ubuntu with the NVIDIA stack) on the node, or list the OS in preflight_distributions.",
    "gpu-missing": "Install the NVIDIA driver (DGX OS ships it - reinstall its nvidia-driver package), then reboot.",
    "gpu-no-driver": ("Load the driver - check dmesg | grep -i nvrm, reinstall the driver that matches the running "
                      "kernel, reboot."),
    "gpu-no-device": "Check that the GPU is enabled and seen (lspci | grep -i nvidia, dmesg | grep -i nvrm), then reboot.",
    "gpu-other": "Run nvidia-smi on the node and repair the driver it reports.",
    "gpu-count": ("Check that every GPU is visible to the driver (nvidia-smi -L), or set preflight_gpu_count to the "
                  "node's real count."),
    "gpu-name": "This deployment (sm_121 kernels, TileLang tiles) is built for NVIDIA GB10; run it on DGX Spark nodes.",
    "gpu-cc": "The SGLang image and its kernels target sm_121; use GB10 nodes.",
    "gpu-driver": "Update the driver (DGX OS: apt update && apt full-upgrade, then reboot) to 580.95.05 or later.",
    "gpu-busy": ("Stop those processes (GB10 memory is shared: they shrink what the model can use; the cgroup names "
                 "the unit or container that runs each: systemctl stop UNIT, docker stop CONTAINER), or list their "
                 "names in preflight_gpu_allowed_processes."),
    "gpu-busy-note": ("nothing to do: spark-llm.service is active and these processes are its own; any other process on "
                      "the GPU is still fatal."),
    "docker-missing": "Install Docker Engine and the NVIDIA Container Toolkit (both ship with DGX OS).",
    "docker-unreachable": ("Start the daemon (systemctl enable --now docker) and check that this user may use "
                           "/var/run/docker.sock."),
    "docker-other": "Run docker info on the node and repair the engine it reports.",
    "docker-runtime": ("Install nvidia-container-toolkit, then nvidia-ctk runtime configure --runtime=docker and "
                       "systemctl restart docker."),
    "memory": ("Stop what uses the memory (GB10 memory is unified: the GPU's share comes out of it; check free -m and "
               "the page cache), or lower preflight_memory_available_min_mib together with the server's memory "
               "settings."),
    "memory-note": "nothing to do on a serving node; the floor applies again when spark-llm.service is stopped.",
    "swap": ("Turn it off (swapoff -a and remove it from /etc/fstab), or accept it (preflight_swap_fatal false only "
             "warns)."),
    "disk": "Free space on /opt/models, or set spark_model_dir to a directory on a larger filesystem.",
    "roce-kernel": ("Boot a kernel that registers RoCE memory (the field reports name 6.17.0-1032-nvidia: pick it under "
                    "GRUB's Advanced options, make it the default with grub-set-default and hold the kernel packages "
                    "with apt-mark hold until a fixed kernel ships), or, where cat /sys/kernel/kexec_crash_size prints "
                    "0, add kho=off to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub and reboot."),
    "fabric": ("Set spark_fabric_interface to the ConnectX-7 port that is cabled (ip -br link on the node lists "
               "them)."),
}

# name -> (probe results, settings, the findings expected: (severity, check, problem, fix)).
CASES = {
    "arch": (probes(facts={"architecture": "x86_64", "distribution": "Ubuntu", "distribution_version": "24.04"}), {},
             [("fatal", "arch", "CPU architecture is x86_64, expected aarch64", FIX["arch"])]),
    "os-version": (probes(facts={"architecture": "aarch64", "distribution": "Ubuntu", "distribution_version": "22.04"}),
                   {}, [("fatal", "os", "OS is Ubuntu 22.04, expected one of Ubuntu >= 24.04", FIX["os"])]),
    "os-distribution": (
        probes(facts={"architecture": "aarch64", "distribution": "Debian", "distribution_version": "13"}),
        {"preflight_distributions": {"Ubuntu": "24.04", "RedHat": 10}},
        [("fatal", "os", "OS is Debian 13, expected one of Ubuntu >= 24.04, RedHat >= 10", FIX["os"])]),
    "gpu-missing": (probes(gpu=gpu_probe(rc=127, stderr="/bin/sh: 1: nvidia-smi: not found")), {},
                    [("fatal", "gpu", "nvidia-smi is not installed", FIX["gpu-missing"])]),
    "gpu-no-driver": (probes(gpu=gpu_probe(rc=9, stdout=NO_DRIVER)), {},
                      [("fatal", "gpu", "nvidia-smi cannot talk to the NVIDIA driver (exit 9)", FIX["gpu-no-driver"])]),
    "gpu-no-device": (probes(gpu=gpu_probe(rc=6, stdout="No devices were found")), {},
                      [("fatal", "gpu", "nvidia-smi finds no GPU (exit 6)", FIX["gpu-no-device"])]),
    "gpu-other": (probes(gpu=gpu_probe(rc=2, stdout='Field "index" is not a valid field to query.', stderr="(x)")), {},
                  [("fatal", "gpu", 'nvidia-smi failed (exit 2): Field "index" is not a valid field to query. (x)',
                    FIX["gpu-other"])]),
    "gpu-other-long": (probes(gpu=gpu_probe(rc=255, stdout="x" * 300)), {},
                       [("fatal", "gpu", "nvidia-smi failed (exit 255): " + "x" * 157 + "...", FIX["gpu-other"])]),
    "gpu-count": (probes(gpu=gpu_probe(rows=(GB10, "1, NVIDIA GB10, 12.1, 580.95.05"))), {},
                  [("fatal", "gpu-count", "nvidia-smi lists 2 GPU(s), expected 1", FIX["gpu-count"])]),
    "gpu-count-none": (probes(gpu=gpu_probe(rows=())), {},
                       [("fatal", "gpu-count", "nvidia-smi lists 0 GPU(s), expected 1", FIX["gpu-count"])]),
    "gpu-name": (probes(gpu=gpu_probe(rows=("0, NVIDIA H100 80GB HBM3, 12.1, 580.95.05",))), {},
                 [("fatal", "gpu-name", 'GPU 0 is "NVIDIA H100 80GB HBM3", expected "NVIDIA GB10"', FIX["gpu-name"])]),
    "gpu-name-two": (probes(gpu=gpu_probe(rows=("0, NVIDIA H100, 12.1, 580.95.05", "1, NVIDIA A100, 12.1, 580.95.05"))),
                     {"preflight_gpu_count": 2},
                     [("fatal", "gpu-name", 'GPU 0 is "NVIDIA H100", GPU 1 is "NVIDIA A100", expected "NVIDIA GB10"',
                       FIX["gpu-name"])]),
    "gpu-cc": (probes(gpu=gpu_probe(rows=("0, NVIDIA GB10, 9.0, 580.95.05",))), {},
               [("fatal", "gpu-cc", "GPU 0 has compute capability 9.0, expected 12.1", FIX["gpu-cc"])]),
    "gpu-driver": (probes(gpu=gpu_probe(rows=("0, NVIDIA GB10, 12.1, 550.54.15",))), {},
                   [("fatal", "gpu-driver", "NVIDIA driver 550.54.15 is older than 580.95.05", FIX["gpu-driver"])]),
    "gpu-busy": (
        probes(gpu=gpu_probe(apps=[(4242, "ollama"), (77, "python3")],
                             cgroups={4242: None, 77: ["0::/user.slice/user-0.slice/session-1.scope"]})), {},
        [("fatal", "gpu-busy", "the GPU is held by pid 4242 (ollama), pid 77 (python3) in "
          "/user.slice/user-0.slice/session-1.scope (spark-llm.service is not active)", FIX["gpu-busy"])]),
    "gpu-busy-beside-the-rank": (
        probes(**SERVING, gpu=gpu_probe(apps=[(100, "sglang::scheduler"), (300, "python3")],
                                        cgroups={100: [f"0::/system.slice/{UNIT}"], 300: ["0::/system.slice/stray.service"]})),
        {},
        [("fatal", "gpu-busy", "the GPU is held by pid 300 (python3) in /system.slice/stray.service "
          "(outside spark-llm.service and its container spark-llm)", FIX["gpu-busy"]),
         ("info", "gpu-busy", "the GPU is held by the running SGLang rank (expected on a re-run): pid 100 "
          "(sglang::scheduler) in the cgroup of spark-llm.service", FIX["gpu-busy-note"])]),
    "gpu-busy-allowed": (probes(gpu=gpu_probe(apps=[(4242, "ollama")], cgroups={4242: ["0::/system.slice/ollama.service"]})),
                         {"preflight_gpu_allowed_processes": ["ollama"]}, []),
    "gpu-rank": (
        probes(**SERVING, gpu=gpu_probe(apps=[(100, "sglang::scheduler"), (200, "python3")],
                                        cgroups={100: [f"0::/system.slice/{UNIT}/payload"],
                                                 200: [f"0::/system.slice/docker-{CONTAINER_ID}.scope"]})),
        {},
        [("info", "gpu-busy", "the GPU is held by the running SGLang rank (expected on a re-run): pid 100 "
          "(sglang::scheduler) in the cgroup of spark-llm.service, pid 200 (python3) in container spark-llm",
          FIX["gpu-busy-note"])]),
    "docker-missing": (probes(docker=docker_probe(rc=127, stderr="/bin/sh: 1: docker: not found")), {},
                       [("fatal", "docker", "docker is not installed", FIX["docker-missing"])]),
    "docker-unreachable": (probes(docker=docker_probe(rc=1, stderr=NO_DAEMON + "\n")), {},
                           [("fatal", "docker", f"the Docker daemon is not reachable: {NO_DAEMON}",
                             FIX["docker-unreachable"])]),
    "docker-other": (probes(docker=docker_probe(rc=1, stderr="permission denied while trying to connect\n")), {},
                     [("fatal", "docker", "docker info failed (exit 1): permission denied while trying to connect",
                       FIX["docker-other"])]),
    "docker-runtime": (probes(docker=docker_probe(runtimes={"runc": {}, "io.containerd.runc.v2": {}})), {},
                       [("fatal", "docker", "Docker has no nvidia runtime (it has runc, io.containerd.runc.v2)",
                         FIX["docker-runtime"])]),
    "memory": (probes(meminfo=meminfo_probe(available_mib=51200)), {},
               [("fatal", "memory", "51200 MiB available, needs 102400 MiB", FIX["memory"])]),
    "memory-serving": (probes(**SERVING, meminfo=meminfo_probe(available_mib=51200)), {},
                       [("info", "memory", "51200 MiB available, below the 102400 MiB floor, which is not applied "
                         "while spark-llm.service is active (its rank holds most of the unified memory)",
                         FIX["memory-note"])]),
    "swap": (probes(meminfo=meminfo_probe(swap_mib=8192)), {},
             [("warn", "swap", "swap is on (8192 MiB): a load that overflows memory pages out instead of failing fast",
               FIX["swap"])]),
    "swap-fatal": (probes(meminfo=meminfo_probe(swap_mib=8192)), {"preflight_swap_fatal": True},
                   [("fatal", "swap", "swap is on (8192 MiB): a load that overflows memory pages out instead of "
                     "failing fast", FIX["swap"])]),
    # The release the field reports name; then the same kernel booted with the reported remedy.
    "kernel-roce": (probes(facts={**GOOD_FACTS, "kernel": "7.0.0-1019-nvidia"}), {},
                    [("warn", "kernel", "kernel 7.0.0-1019-nvidia is reported to break RoCE: NCCL's ibv_reg_mr_iova2 "
                      "fails with ENOMEM at init", FIX["roce-kernel"])]),
    "kernel-roce-kho-off": (probes(facts={**GOOD_FACTS, "kernel": "7.0.0-1019-nvidia",
                                          "proc_cmdline": {"ro": True, "kho": ["on", "off"]}}), {}, []),
    # The fault itself, as /proc/meminfo showed it on a pair that failed (CmaFree 940604 kB, CmaTotal 0 kB),
    # on a release the table does not name; a kernel with working CMA, and one without CMA, pass.
    "cma-broken": (probes(facts={**GOOD_FACTS, "kernel": "7.0.0-31-generic"}, meminfo=meminfo_probe(cma_kib=(0, 940604))),
                   {}, [("warn", "cma", "the kernel reports CmaFree 940604 kB above CmaTotal 0 kB: the CMA fault under "
                         "which NCCL's memory registration over RoCE (ibv_reg_mr) fails with ENOMEM and the ranks "
                         "cannot form the group", FIX["roce-kernel"])]),
    "cma-working": (probes(meminfo=meminfo_probe(cma_kib=(65536, 60000))), {}, []),
    "cma-absent": (probes(meminfo=meminfo_probe()), {}, []),
    "disk-unmeasured": (
        probes(disk=disk_probe(mount="/opt/models", rc=1, stderr="find: '/opt/models/glm53/x': Permission denied\n")), {},
        [("fatal", "disk", "cannot measure the filesystem of /opt/models/glm53: find: '/opt/models/glm53/x': "
          "Permission denied", FIX["disk"])]),
    "disk-empty": (probes(disk=disk_probe(avail=32 * MIB, mount="/opt/models")), {},
                   [("fatal", "disk", "/opt/models (holds /opt/models/glm53) has 32.00 MB free, needs 56.00 MB "
                     "(48.00 MB of the 48.00 MB checkpoint still missing, plus 8.00 MB headroom)", FIX["disk"])]),
    "disk-half": (probes(disk=disk_probe(avail=8 * MIB, mount="/opt/models", present=24 * MIB)), {},
                  [("fatal", "disk", "/opt/models (holds /opt/models/glm53) has 8.00 MB free, needs 32.00 MB "
                    "(24.00 MB of the 48.00 MB checkpoint still missing, plus 8.00 MB headroom)", FIX["disk"])]),
    "disk-complete": (probes(disk=disk_probe(avail=16 * MIB, mount="/opt/models", present=48 * MIB)), {}, []),
    "disk-fits": (probes(disk=disk_probe(avail=56 * MIB, mount="/opt/models")), {}, []),
    # A build switch fetches beside the checkpoints already there: the message names them, for the operator to
    # choose what to remove (nothing here removes one).
    "disk-beside-another-build": (
        probes(disk=disk_probe(avail=32 * MIB, mount="/opt/models"),
               checkpoints={"here": {}, "beside": [ALT, {**SEED, "verified": False}]}), {},
        [("fatal", "disk", "/opt/models (holds /opt/models/glm53) has 32.00 MB free, needs 56.00 MB (48.00 MB of the "
          "48.00 MB checkpoint still missing, plus 8.00 MB headroom); beside it are /opt/models/glm53-alt "
          "(SparkSite/GLM-5.3-Flash-NVFP4-alt at bbbbbbbbbbbb, 48.00 MB), /opt/models/glm53-seed "
          "(LibertAIDAI/GLM-5.3-Flash-NVFP4 at aaaaaaaaaaaa, 48.00 MB, not verified)",
          FIX["disk"][:-1] + "; or remove a checkpoint the group no longer serves (its directory, <dir>.record.json "
          "and <dir>.verified: the playbooks never delete one, and the one the group serves now is what a failed "
          "switch goes back to).")]),
    # The model directory holds another repository's checkpoint: fetching there would overwrite it.
    "checkpoint-another-build": (
        probes(checkpoints={"here": {**ALT, "dir": "/opt/models/glm53"}, "beside": []}), {},
        [("fatal", "checkpoint", "/opt/models/glm53 holds SparkSite/GLM-5.3-Flash-NVFP4-alt at " + "b" * 40
          + " (verified); this run deploys LibertAIDAI/GLM-5.3-Flash-NVFP4 there, over it",
          "Give the build a directory of its own: leave spark_model_dir out of the inventory (a named build, "
          "spark_checkpoint_build, lands in spark_models_root/<its directory>) or set it to a new directory. The "
          "checkpoint in /opt/models/glm53 stays, for the group to go back to.")]),
    "checkpoint-same-build": (probes(checkpoints={"here": {**SEED, "dir": "/opt/models/glm53"}, "beside": [ALT]}), {}, []),
    "checkpoint-unchecked": (probes(checkpoints={"here": {**ALT, "dir": "/opt/models/glm53"}, "beside": []}),
                             {"preflight_checkpoint_repo_id": ""}, []),
    "fabric": (probes(netdevs=netdevs_probe(("lo", "enp1s0f1np1"))),
               {"preflight_fabric_interfaces": ["enp1s0f1np1", "enp1s0f0np0"]},
               [("fatal", "fabric", "fabric interface(s) enp1s0f0np0 not present (the node has enp1s0f1np1, lo)",
                 FIX["fabric"])]),
    "fabric-not-configured": (probes(netdevs={"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}),
                              {"preflight_fabric_interfaces": []}, []),
    # The port set down by hand here; its peer then sees it up without carrier, explained by this one.
    "fabric-down": (probes(links={"enp1s0f1np1": {"up": False, "carrier": None, "operstate": "down"}}),
                    {"preflight_fabric_interfaces": ["enp1s0f1np1"]},
                    [("warn", "fabric-link", "fabric interface(s) enp1s0f1np1 down (administratively: set down by hand, "
                      "or never brought up)", "playbooks/fabric.yml brings it up and reports the drift (site.yml runs it "
                      "after preflight); or ip link set enp1s0f1np1 up.")]),
    "fabric-peer-down": (probes(links=UP_NO_CARRIER, peer_links={"spark-1": {"enp1s0f1np1": {"up": False}}}),
                         {"preflight_fabric_interfaces": ["enp1s0f1np1"]},
                         [("warn", "fabric-link", "fabric interface(s) enp1s0f1np1 up but without carrier: the fabric "
                           "port of spark-1 is down", "playbooks/fabric.yml brings the peer's port up (site.yml runs it "
                           "after preflight).")]),
    "fabric-no-carrier": (probes(links=UP_NO_CARRIER, peer_links={"spark-1": {"enp1s0f1np1": {"up": True}}}),
                          {"preflight_fabric_interfaces": ["enp1s0f1np1"]},
                          [("fatal", "fabric-link", "fabric interface(s) enp1s0f1np1 up but without carrier",
                            "Check the cable and the peer: the cable is not in this port (ip -br link shows which "
                            "ConnectX-7 port has carrier; set spark_fabric_interface to it), or the peer is off or its "
                            "port down.")]),
    "fabric-up": (probes(links={"enp1s0f1np1": {"up": True, "carrier": True, "operstate": "up"}}),
                  {"preflight_fabric_interfaces": ["enp1s0f1np1"]}, []),
}


def test_a_good_node_has_no_finding():
    assert findings() == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_check_reports_its_problem_severity_and_fix(name):
    node, settings, expected = CASES[name]
    assert rows(node, **settings) == expected


def test_every_row_of_the_table_is_exercised():
    """Each row of the table (a check may have several: one per state of its tool) fires in some case above."""
    for index, entry in enumerate(CHECKS):
        fired = [name for name, (node, settings, _) in CASES.items()
                 if preflight.preflight_findings(node, [entry], {**SETTINGS, **settings})]
        assert fired, f"row {index} ({entry['check']}, when {entry['when']!r}) fires in no case"


def test_the_table_names_known_severities_and_has_every_field():
    for entry in CHECKS:
        assert set(entry) <= {"check", "severity", "vars", "when", "problem", "fix"}, entry
        assert {"check", "severity", "when", "problem", "fix"} <= set(entry), entry
    assert {e["check"] for e in CHECKS} == {"arch", "os", "gpu", "gpu-count", "gpu-name", "gpu-cc", "gpu-driver",
                                            "gpu-busy", "docker", "memory", "swap", "kernel", "cma", "disk", "checkpoint",
                                            "fabric", "fabric-link"}


def test_every_fault_of_a_node_is_reported_in_table_order():
    node = probes(facts={"architecture": "x86_64", "distribution": "Ubuntu", "distribution_version": "24.04"},
                  gpu=gpu_probe(rc=9, stdout=NO_DRIVER), docker=docker_probe(rc=1, stderr=NO_DAEMON),
                  meminfo=meminfo_probe(available_mib=1024, swap_mib=16),
                  disk=disk_probe(avail=MIB, mount="/opt/models"), netdevs=netdevs_probe(("lo",)))
    assert [(f["severity"], f["check"]) for f in findings(node)] == [
        ("fatal", "arch"), ("fatal", "gpu"), ("fatal", "docker"), ("fatal", "memory"), ("warn", "swap"),
        ("fatal", "disk"), ("fatal", "fabric")]


def test_no_gpu_check_reads_rows_of_a_failed_nvidia_smi():
    # A failed query prints no rows: only the gpu finding, not "lists 0 GPU(s)".
    assert [f["check"] for f in findings(probes(gpu=gpu_probe(rc=6, stdout="No devices were found")))] == ["gpu"]


@pytest.mark.parametrize(
    ("active", "lines", "owner", "shown"),
    [
        (True, [f"0::/system.slice/{UNIT}"], "unit", f"/system.slice/{UNIT}"),
        (True, [f"0::/system.slice/{UNIT}/init.scope"], "unit", f"/system.slice/{UNIT}/init.scope"),
        # A unit whose name merely starts like the server's is someone else.
        (True, [f"0::/system.slice/{UNIT}-extra"], "foreign", f"/system.slice/{UNIT}-extra"),
        (True, [f"0::/system.slice/docker-{CONTAINER_ID}.scope"], "container", f"/system.slice/docker-{CONTAINER_ID}.scope"),
        # A hybrid (v1 + v2) hierarchy: any line can name the unit; the unified one is shown.
        (True, ["12:memory:/system.slice/" + UNIT, "0::/system.slice/other.service"], "unit", "/system.slice/other.service"),
        (True, ["0::/user.slice/user-0.slice/session-4.scope"], "foreign", "/user.slice/user-0.slice/session-4.scope"),
        # Nothing vouches for a process while the unit is not active.
        (False, [f"0::/system.slice/{UNIT}"], "foreign", f"/system.slice/{UNIT}"),
        (False, [f"0::/system.slice/docker-{CONTAINER_ID}.scope"], "foreign", f"/system.slice/docker-{CONTAINER_ID}.scope"),
        # Exited between nvidia-smi's listing and the cgroup read.
        (True, None, "gone", "-"),
    ],
    ids=["unit", "below-unit", "prefix-only", "container-scope", "hybrid", "session", "inactive-unit",
         "inactive-container", "gone"],
)
def test_a_gpu_process_belongs_to_the_rank_by_its_cgroup(active, lines, owner, shown):
    node = probes(unit=unit_probe(active=active, cgroup=f"/system.slice/{UNIT}"),
                  container={"name": "spark-llm", "id": CONTAINER_ID},
                  gpu=gpu_probe(apps=[(500, "python3")], cgroups={500: lines}))
    gpu = preflight.preflight_facts(node)["gpu"]
    assert gpu["owners"] == {"500": ["500", owner, shown]}
    assert gpu["rank_pids"] == (["500"] if owner in ("unit", "container") else [])


def test_a_unit_systemd_does_not_know_is_not_active():
    missing = {"changed": False, "name": UNIT, "status": {"LoadState": "not-found", "ActiveState": "inactive"}}
    failed = {"changed": False, "failed": True, "msg": "Failed to connect to bus"}
    for unit in (missing, failed):
        assert preflight.preflight_facts(probes(unit=unit))["server"]["active"] is False


def test_a_severity_outside_the_three_is_refused():
    entry = {"check": "x", "severity": "{{ 'error' }}", "when": "true", "problem": "p", "fix": "f"}
    with pytest.raises(ValueError, match="severity 'error'"):
        preflight.preflight_findings(probes(), [entry], SETTINGS)


def test_an_undefined_name_in_the_table_is_an_error():
    entry = {"check": "x", "severity": "fatal", "when": "no_such_fact", "problem": "p", "fix": "f"}
    with pytest.raises(Exception, match="no_such_fact"):
        preflight.preflight_findings(probes(), [entry], SETTINGS)


def test_the_summary_records_each_node_kernel_and_driver():
    assert preflight.preflight_platform(probes()) == {"kernel": "6.17.0-1032-nvidia", "driver": "580.95.05"}
    # Unknown stays empty (the summary says so): no driver answering, no kernel fact.
    lost = probes(facts={"architecture": "aarch64"}, gpu=gpu_probe(rc=9, stdout=NO_DRIVER))
    assert preflight.preflight_platform(lost) == {"kernel": "", "driver": ""}

