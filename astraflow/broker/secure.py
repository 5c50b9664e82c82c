"""What `astraflow broker start --secure` adds to the local broker: a CA and a broker certificate
it makes itself (openssl), SCRAM-SHA-512 users (one per component kind), the SASL_SSL listener and
the StandardAuthorizer, and the credentials clients need, written to `<data dir>/secure/` with mode
0600.

The client listener is SASL_SSL with SCRAM-SHA-512. The controller listener (loopback only, never
advertised) is SASL_PLAINTEXT with PLAIN: KRaft keeps SCRAM credentials in the metadata log, which the
controller must serve before anyone could authenticate with them, so the controller cannot use SCRAM;
a PLAIN user known only to the broker's own JAAS config keeps other local processes off it (PLAINTEXT
would make its anonymous principal a super user). The ACLs that apply to the users live in
`astraflow.broker.acls`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from astraflow.errors import BrokerError

SECURE_DIR = "secure"
CREDENTIALS = "credentials.json"
MECHANISM = "SCRAM-SHA-512"
#: the broker's own principal (inter-broker and controller traffic): a super user
BROKER_USER = "broker"
#: one principal per component kind; `admin` is what `astraflow run` and the operator use (super user)
KINDS = ("admin", "trainer", "streams", "worker", "feeder")
SUPER_USERS = (BROKER_USER, "admin")


@dataclass(frozen=True)
class Credentials:
    """What a client of the secured broker needs: its user, the password and the CA."""

    username: str
    password: str
    ca_location: str

    def env(self, bootstrap: str) -> dict[str, str]:
        """ASTRAFLOW_* variables that make `KafkaSettings.from_env` connect as this user."""
        return {
            "ASTRAFLOW_BOOTSTRAP": bootstrap,
            "ASTRAFLOW_SECURITY_PROTOCOL": "SASL_SSL",
            "ASTRAFLOW_SASL_MECHANISM": MECHANISM,
            "ASTRAFLOW_SASL_USERNAME": self.username,
            "ASTRAFLOW_SASL_PASSWORD": self.password,
            "ASTRAFLOW_SSL_CA_LOCATION": self.ca_location,
        }


def secure_dir(data_dir: Path) -> Path:
    return data_dir / SECURE_DIR


def write_private(path: Path, text: str) -> None:
    """Create `path` with mode 0600 from the start (no window where it is world-readable)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed: {(result.stdout + result.stderr).strip()[-1500:]}")


def make_certificates(sdir: Path) -> None:
    """A CA (ca.pem, its key ca.key) and, signed by it for localhost/127.0.0.1, a certificate for the
    broker and one for the trainers' weight servers, each as one PEM (PKCS#8 key + chain: broker.pem,
    which Kafka reads with ssl.keystore.type=PEM, and weights.pem). Made once: existing files are kept
    so clients' CA files stay valid across restarts."""
    sdir.mkdir(parents=True, exist_ok=True)
    os.chmod(sdir, 0o700)
    old = os.umask(0o077)  # keys are born private
    try:
        if not (sdir / "ca.pem").exists():
            _openssl(
                "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "ca.key", cwd=sdir
            )
            _openssl(
                "req",
                "-x509",
                "-new",
                "-key",
                "ca.key",
                "-sha256",
                "-days",
                "3650",
                "-subj",
                "/CN=AstraFlow local CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-out",
                "ca.pem",
                cwd=sdir,
            )
            os.chmod(sdir / "ca.pem", 0o644)  # the CA certificate is public; its key is not
        for name in ("broker", "weights"):
            if not (sdir / f"{name}.pem").exists():
                _leaf(sdir, name)
    finally:
        os.umask(old)


def _leaf(sdir: Path, name: str) -> None:
    """`<name>.pem`: a key and a server certificate for localhost and 127.0.0.1 signed by the CA."""
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", f"{name}.key", cwd=sdir
    )
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", "/CN=localhost", "-out", f"{name}.csr", cwd=sdir)
    (sdir / f"{name}.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "825",
        "-sha256",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=sdir,
    )
    bundle = "".join((sdir / f).read_text() for f in (f"{name}.key", f"{name}.crt", "ca.pem"))
    write_private(sdir / f"{name}.pem", bundle)
    for suffix in ("csr", "ext", "crt", "key"):
        (sdir / f"{name}.{suffix}").unlink(missing_ok=True)


def ensure_credentials(data_dir: Path) -> dict[str, str]:
    """user -> password for the broker user and every component kind; made once, kept 0600."""
    path = secure_dir(data_dir) / CREDENTIALS
    if path.exists():
        return dict(json.loads(path.read_text())["passwords"])
    secure_dir(data_dir).mkdir(parents=True, exist_ok=True)
    passwords = {u: secrets.token_urlsafe(24) for u in (BROKER_USER, *KINDS)}
    write_private(path, json.dumps({"mechanism": MECHANISM, "passwords": passwords}, indent=2))
    return passwords


def run_secrets(data_dir: Path) -> dict[str, str]:
    """The weight server's token and the WeightVersion HMAC key of the runs on this broker: made
    once and kept (0600), so a resumed run still accepts the events already on `weights`."""
    path = secure_dir(data_dir) / "run-secrets.json"
    if not path.exists():
        secure_dir(data_dir).mkdir(parents=True, exist_ok=True)
        write_private(
            path,
            json.dumps(
                {"weights_token": secrets.token_urlsafe(32), "weights_mac_key": secrets.token_urlsafe(32)},
                indent=2,
            ),
        )
    return dict(json.loads(path.read_text()))


def credentials(data_dir: Path, kind: str) -> Credentials:
    """The credentials of component kind `kind` (or `admin`) of the secured broker in `data_dir`."""
    path = secure_dir(data_dir) / CREDENTIALS
    if not path.exists():
        raise BrokerError(
            f"{data_dir} holds no secured broker (no {path}); start one with "
            f"`astraflow broker start --secure`"
        )
    passwords = json.loads(path.read_text())["passwords"]
    if kind not in passwords:
        raise BrokerError(f"no credentials for {kind!r} in {path}; known: {', '.join(sorted(passwords))}")
    return Credentials(kind, passwords[kind], str(secure_dir(data_dir) / "ca.pem"))


def scram_format_args(passwords: dict[str, str]) -> list[str]:
    """`kafka-storage format` arguments that create the SCRAM users in the first metadata."""
    out = []
    for user, password in passwords.items():
        out += ["--add-scram", f"{MECHANISM}=[name={user},password={password}]"]
    return out


def jaas(module: str, user: str, password: str, **extra: str) -> str:
    options = " ".join(f'{k}="{v}"' for k, v in {"username": user, "password": password, **extra}.items())
    return f"{module} required {options};"


def server_properties(
    data_dir: Path, port: int, controller_port: int, passwords: dict[str, str]
) -> dict[str, str]:
    """The listener, TLS, SASL and authorizer settings of a secured broker (merged over the plain ones)."""
    sdir = secure_dir(data_dir)
    broker_pw = passwords[BROKER_USER]
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas(scram, BROKER_USER, broker_pw),
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": jaas(
            plain, BROKER_USER, broker_pw, **{f"user_{BROKER_USER}": broker_pw}
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(sdir / "broker.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(sdir / "ca.pem"),
        "ssl.client.auth": "none",
        "ssl.endpoint.identification.algorithm": "https",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": ";".join(f"User:{u}" for u in SUPER_USERS),
    }
