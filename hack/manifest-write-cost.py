#!/usr/bin/env python3
"""What one write of a Manifest costs the control plane, against writes of a ConfigMap measured
in the same run (docs/benchmarks.md, "What a Manifest write costs the control plane").

Usage: make cluster-up && python3 hack/manifest-write-cost.py [KUBECONFIG] [N]

Sends N requests of each kind, one at a time over one connection, and reads the CPU time of the
kube-apiserver and etcd processes (/proc/<pid>/stat) before and after: CPU-ms per request, and
each as a ratio to a ConfigMap merge patch. Needs PyYAML. Leaves a namespace `write-cost-<time>`
and a CRD `manifests.free.write-cost.io` behind (`make cluster-down` removes everything).
"""

import base64
import copy
import http.client
import json
import os
import ssl
import sys
import tempfile
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KUBECONFIG = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.cache/module-manager/cluster/run/admin.kubeconfig")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 300
MERGE = "application/merge-patch+json"


def connect(path):
    config = yaml.safe_load(open(path))
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    folder = tempfile.mkdtemp()

    def pem(name, data):
        file = os.path.join(folder, name)
        open(file, "wb").write(base64.b64decode(data))
        return file

    context = ssl.create_default_context(cafile=pem("ca", cluster["certificate-authority-data"]))
    context.load_cert_chain(pem("crt", user["client-certificate-data"]),
                            pem("key", user["client-key-data"]))
    host, port = cluster["server"].removeprefix("https://").split(":")
    return http.client.HTTPSConnection(host, int(port), context=context)


CONNECTION = connect(KUBECONFIG)


def send(method, path, body, content_type="application/json"):
    CONNECTION.request(method, path, body=json.dumps(body), headers={
        "Content-Type": content_type, "Accept": "application/json"})
    answer = CONNECTION.getresponse()
    data = answer.read()
    if answer.status >= 300 and answer.status != 409:
        sys.exit(f"{method} {path}: {answer.status} {data[:300]!r}")
    return data


def control_plane_pids():
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
        except OSError:
            continue
        if command.endswith((b"/kube-apiserver", b"/etcd")):
            pids.append(pid)
    if not pids:
        sys.exit("no kube-apiserver or etcd process on this machine: run `make cluster-up`")
    return pids


PIDS = control_plane_pids()


def cpu_seconds():
    total = 0
    for pid in PIDS:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


NAMESPACE = f"write-cost-{int(time.time())}"
SPEC = {"module": "podinfo", "interval": "10m",
        "chart": {"path": "loadtest/charts/podinfo-like"}, "values": {"replicas": 0}}


def ready_status(i):
    """A Ready install's status of the load test's chart, the size module-manager writes."""
    message = f"4 objects applied and ready ({i})"
    kinds = [("apps", "Deployment"), ("", "ConfigMap"), ("", "Service"), ("", "ServiceAccount")]
    inventory = [{"group": g, "version": "v1", "kind": k, "namespace": NAMESPACE, "name": "web"}
                 for g, k in kinds]
    conditions = [{"type": t, "status": "True", "reason": "Ready", "message": message,
                   "observedGeneration": 1, "lastTransitionTime": "2026-12-03T06:00:00Z"}
                  for t in ("Ready", "Reconciling", "Stalled", "Rendered", "Applied")]
    return {
        "state": "Ready", "observedGeneration": 1, "conditions": conditions,
        "chartDigest": "sha256:" + "a" * 64, "renderedDigest": "sha256:" + "b" * 64,
        "valuesDigest": "sha256:" + "c" * 64, "appliedGeneration": 1, "inventory": inventory,
        "inventoryUids": {f"{k}/{NAMESPACE}/web": "0f0f0f0f-1111-2222-3333-444455556666"
                          for _, k in kinds},
        "targetIdentity": "00000000-0000-0000-0000-000000000000", "shard": 17, "owner": "mm-0",
        "lastOperation": {"operation": "Install", "time": "2026-12-03T06:00:00Z",
                          "message": message},
        "hookRun": {"operation": "Install", "inputsDigest": "sha256:" + "d" * 64,
                    "generation": 1, "id": "0123456789abcdef", "phase": "Done", "completed": []},
        "hookObjects": [],
    }


def free_status_crd():
    """The Manifest CRD under another group, its status without a schema."""
    crd = copy.deepcopy(yaml.safe_load(open(os.path.join(REPO, "crds/manifest.yaml"))))
    crd["metadata"]["name"] = "manifests.free.write-cost.io"
    crd["spec"]["group"] = "free.write-cost.io"
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    send("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    time.sleep(5)  # Established, and served


def manifests(group="modulemanager.io"):
    return f"/apis/{group}/v1alpha1/namespaces/{NAMESPACE}/manifests"


def create_manifest(name, group="modulemanager.io", status=None):
    body = {"apiVersion": f"{group}/v1alpha1", "kind": "Manifest",
            "metadata": {"name": name}, "spec": SPEC}
    send("POST", manifests(group), body)
    if status is not None:
        send("PATCH", f"{manifests(group)}/{name}/status", {"status": status}, MERGE)


def measure(one):
    one(-1)
    before = cpu_seconds()
    for i in range(N):
        one(i)
    return 1000 * (cpu_seconds() - before) / N


def main():
    send("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": NAMESPACE}})
    free_status_crd()
    configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    send("POST", configmaps, {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "patched"}, "data": {}})
    create_manifest("empty")
    create_manifest("full", status=ready_status(0))
    create_manifest("free", group="free.write-cost.io", status=ready_status(0))
    cases = [
        ("ConfigMap merge patch (baseline)", lambda i: send(
            "PATCH", f"{configmaps}/patched", {"data": {"status": json.dumps(ready_status(i))}},
            MERGE)),
        ("ConfigMap create", lambda i: send("POST", configmaps, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i + 1}"}})),
        ("Manifest create", lambda i: create_manifest(f"m{i + 1}")),
        ("Manifest without a status: one-field status patch", lambda i: send(
            "PATCH", f"{manifests()}/empty/status", {"status": {"owner": f"mm-{i}"}}, MERGE)),
        ("Manifest with a Ready status: one-field status patch", lambda i: send(
            "PATCH", f"{manifests()}/full/status", {"status": {"owner": f"mm-{i}"}}, MERGE)),
        ("Manifest with a Ready status: whole-status patch", lambda i: send(
            "PATCH", f"{manifests()}/full/status", {"status": ready_status(i)}, MERGE)),
        ("same, its status without a schema", lambda i: send(
            "PATCH", f"{manifests('free.write-cost.io')}/free/status",
            {"status": ready_status(i)}, MERGE)),
    ]
    baseline = None
    print(f"{N} requests each; control plane CPU (kube-apiserver, etcd) per request")
    for label, one in cases:
        cost = measure(one)
        baseline = baseline or cost
        print(f"  {label:55s} {cost:6.2f} ms  {cost / baseline:5.2f}×")


if __name__ == "__main__":
    main()
