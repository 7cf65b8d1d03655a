"""Secure by default, in the server role's plan: the API key's rules and the TLS settings, refused up front.

Every refusal names the variable, the value (never the key's: its length), why and the fix. The
end-to-end proof (keys served, 401s, nginx on a simulated head) is tests/integration/test_secure_endpoint.py.
"""

from __future__ import annotations

import jinja2
import pytest
import yaml

from tests.lib.playbook import REPO
from tests.lib.roles import filter_plugin
from tests.lib.server_plan import DEFAULTS, FILTER, MODEL, VARS, ctx

SPARK_FILTERS = filter_plugin("spark")

KEY = "k" * 32  # the shortest key accepted
PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
PEM_KEY = "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n"


def plan(**changes):
    return FILTER.server_plan(ctx(**changes), MODEL)


def only_error(**changes):
    errors = plan(**changes)["errors"]
    assert len(errors) == 1, errors
    assert "Fix:" in errors[0], errors[0]
    return errors[0]


def flag(result, name):
    return result["args"][result["args"].index(name) + 1]


def test_secure_defaults():
    assert DEFAULTS["server_api_key"] == ""
    assert DEFAULTS["server_allow_unauthenticated"] is False
    assert DEFAULTS["server_tls"] is False
    result = plan()
    assert result["errors"] == []
    assert (flag(result, "--host"), flag(result, "--port")) == ("0.0.0.0", "30000")  # noqa: S104 - compared


@pytest.mark.parametrize("key", ["short-key", "x" * 31])
def test_a_short_key_is_refused_with_its_length_never_its_value(key):
    message = only_error(server_api_key=key)
    assert message.startswith(f"server_api_key = <redacted, {len(key)} characters>: shorter than 32")
    assert key not in message and key not in repr(plan(server_api_key=key))
    assert "leave it empty" in message and "openssl rand" in message


def test_a_key_of_32_characters_passes_and_stays_out_of_the_plan():
    result = plan(server_api_key=KEY)
    assert result["errors"] == [] and KEY not in repr(result)


def test_a_key_with_whitespace_is_refused():
    message = only_error(server_api_key="a" * 20 + " " + "b" * 20)
    assert "<redacted, 41 characters>" in message and "whitespace" in message


def test_allow_unauthenticated_with_a_key_set_is_fine():
    assert plan(server_api_key=KEY, server_allow_unauthenticated=True)["errors"] == []
    assert plan(server_allow_unauthenticated=True)["errors"] == []


@pytest.mark.parametrize("var", ["server_allow_unauthenticated", "server_tls"])
def test_switches_take_booleans_and_what_ansibles_bool_filter_takes(var):
    assert plan(**{var: "true"})["errors"] == []
    message = only_error(**{var: "maybe"})
    assert message.startswith(f"{var} = 'maybe': must be true or false")


def test_tls_moves_sglang_behind_the_proxy_on_the_loopback():
    result = plan(server_tls=True)
    assert result["errors"] == []
    assert (flag(result, "--host"), flag(result, "--port")) == ("127.0.0.1", "30001")
    assert (flag(plan(server_tls="true", server_tls_backend_port=31000), "--port")) == "31000"


@pytest.mark.parametrize(("port", "clash"), [(30000, "server_port"), (20000, "server_dist_init_port")])
def test_the_backend_port_may_not_be_one_the_head_listens_on(port, clash):
    message = only_error(server_tls=True, server_tls_backend_port=port)
    assert message.startswith(f"server_tls_backend_port = {port}: equals {clash}")


def test_a_certificate_without_its_key_is_refused(tmp_path):
    cert = tmp_path / "server.crt"
    cert.write_text(PEM_CERT)
    message = only_error(server_tls=True, server_tls_cert=str(cert))
    assert message.startswith("server_tls_key = '': server_tls_cert is set") and "as a pair" in message


def test_a_given_pair_that_is_there_and_readable_passes(tmp_path):
    (tmp_path / "s.crt").write_text(PEM_CERT)
    (tmp_path / "s.key").write_text(PEM_KEY)
    assert plan(server_tls=True, server_tls_cert=str(tmp_path / "s.crt"),
                server_tls_key=str(tmp_path / "s.key"), server_tls_ca=str(tmp_path / "s.crt"))["errors"] == []


@pytest.mark.parametrize(("case", "fragment"), [
    ("missing", "no such file on the controller"),
    ("directory", "cannot be read on the controller (Is a directory)"),
    ("not-pem", "not a PEM key (no -----BEGIN  ... PRIVATE KEY----- line)"),
    ("relative", "not an absolute path on the controller"),
])
def test_a_missing_or_unreadable_key_file_is_refused(tmp_path, case, fragment):
    (tmp_path / "s.crt").write_text(PEM_CERT)
    key = {"missing": str(tmp_path / "nope.key"), "directory": str(tmp_path), "relative": "tls/s.key",
           "not-pem": str(tmp_path / "s.crt")}[case]
    message = only_error(server_tls=True, server_tls_cert=str(tmp_path / "s.crt"), server_tls_key=key)
    assert message.startswith(f"server_tls_key = {key!r}: {fragment}"), message
    assert "Fix: give the absolute controller path of a readable PEM key file" in message


def test_tls_files_are_not_read_while_tls_is_off(tmp_path):
    assert plan(server_tls_cert=str(tmp_path / "nope.crt"), server_tls_key="relative")["errors"] == []


def test_subject_alt_names_are_dns_or_ip_entries():
    assert plan(server_tls=True, server_tls_subject_alt_names=["DNS:llm.example.org", "IP:10.0.0.9"])[
        "errors"] == []
    message = only_error(server_tls=True, server_tls_subject_alt_names=["llm.example.org"])
    assert message.startswith("server_tls_subject_alt_names = ['llm.example.org']: must be a list of DNS:")


@pytest.mark.parametrize("credentials_dir", ["", "/srv/secrets"])
@pytest.mark.parametrize("tls_cert", ["", "/etc/pki/given.crt"])
def test_clients_look_for_the_key_and_ca_where_the_server_role_puts_them(credentials_dir, tls_cert):
    """group_vars/all wires verify (and through it doctor and the benchmark) to the server role's files."""
    wiring = yaml.safe_load((REPO / "playbooks" / "group_vars" / "all" / "spark.yml").read_text())
    names = yaml.safe_load((REPO / "roles" / "spark" / "vars" / "main.yml").read_text())
    values = {"inventory_dir": "/sites/mine", "server_credentials_dir": credentials_dir,
              "spark_api_key_name": names["spark_api_key_name"], "spark_tls_name": names["spark_tls_name"],
              "spark_legacy_names": names["spark_legacy_names"],
              "server_tls": True, "server_tls_cert": tls_cert, "server_tls_ca": "/etc/pki/ca.crt"}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)  # noqa: S701 - Ansible values, not HTML
    env.filters["bool"] = bool
    env.filters["dgx_spark.llm_serving.spark_credential_file"] = SPARK_FILTERS.spark_credential_file

    def render(text, **extra):
        return env.from_string(text).render(**values, **extra).strip()

    server_dir = render(VARS["__server_credentials_dir"])
    server_key_file = render(VARS["__server_api_key_file"], __server_credentials_dir=server_dir)
    generated = render(VARS["__server_tls_generated"]) == "True"
    server_ca = render(VARS["__server_tls_ca_file"], __server_credentials_dir=server_dir,
                       __server_tls_generated=generated)
    assert render(wiring["verify_api_key_file"]) == server_key_file
    assert render(wiring["verify_tls_ca"]) == server_ca
    assert server_key_file == f"{credentials_dir or '/sites/mine/.credentials'}/spark_llm_api_key"
    assert server_ca == ("/etc/pki/ca.crt" if tls_cert else f"{credentials_dir or '/sites/mine/.credentials'}/spark-llm-ca.crt")


@pytest.mark.parametrize(("tls", "host", "expected"), [
    (False, "0.0.0.0", "http://127.0.0.1:30000"),  # noqa: S104 - compared, not bound
    (False, "10.0.0.10", "http://10.0.0.10:30000"),
    (True, "10.0.0.10", "http://127.0.0.1:30001"),
])
def test_the_supervisor_probes_sglang_itself_behind_the_proxy(tls, host, expected):
    """With TLS the supervisor's generation probe (on the head, key from the env file) goes to the loopback backend."""
    wiring = yaml.safe_load((REPO / "playbooks" / "group_vars" / "all" / "spark.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)  # noqa: S701 - Ansible values, not HTML
    env.filters["bool"] = bool
    endpoint = env.from_string(wiring["supervisor_endpoint"]).render(
        server_tls=tls, server_host=host, server_port=30000, server_tls_backend_port=30001)
    assert endpoint.replace("\n", "").replace(" ", "") == expected


def test_a_relative_credentials_directory_is_refused():
    assert plan(server_credentials_dir="/srv/spark-credentials")["errors"] == []
    message = only_error(server_credentials_dir="secrets")
    assert message.startswith("server_credentials_dir = 'secrets': ") and "absolute controller path" in message
