"""The local cluster's own certificate authority and one certificate per node, made with `openssl`.

A secured cluster trusts nothing it did not issue: clients verify brokers against `ca.crt`, and brokers and
controllers talk to each other over mutual TLS with their node certificates (subject CN=kafka-node-K, which
the brokers map to the principal User:kafka-node-K). Keys are EC P-256 (fast to make and to handshake) and
never leave the state folder (mode 0600).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infra.errors import BrokerStartFailed, PrerequisiteMissing

CA_DAYS = 3650
NODE_DAYS = 825
CA_SUBJECT = "/CN=Tether local Kafka CA"


def node_name(node: int) -> str:
    """The node's certificate CN, and so its principal (User:kafka-node-K)."""
    return f"kafka-node-{node}"


@dataclass(frozen=True)
class Certificates:
    """Where one cluster's TLS material lives."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    def node_pem(self, node: int) -> Path:
        """Private key then certificate, the PEM keystore Kafka reads."""
        return self.folder / f"{node_name(node)}.pem"

    def ensure(self, nodes: range, hosts: tuple[str, ...]) -> None:
        """The CA and every node's certificate, made once; existing ones are kept (clients trust them)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        if not self.ca_cert.exists():
            _openssl("req", "-x509", "-new", *_EC_KEY, "-nodes", "-keyout", str(self.ca_key), "-out",
                     str(self.ca_cert), "-days", str(CA_DAYS), "-subj", CA_SUBJECT,
                     "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        for node in nodes:
            if not self.node_pem(node).exists():
                self._issue(node, hosts)

    def _issue(self, node: int, hosts: tuple[str, ...]) -> None:
        name = node_name(node)
        key, csr, crt, ext = (self.folder / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
        sans = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in dict.fromkeys((*hosts, "localhost")))
        ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n"
                       "keyUsage=critical,digitalSignature,keyAgreement\nbasicConstraints=CA:FALSE\n")
        try:
            _openssl("req", "-new", *_EC_KEY, "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
            _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey", str(self.ca_key),
                     "-CAcreateserial", "-out", str(crt), "-days", str(NODE_DAYS), "-extfile", str(ext))
            pem = self.node_pem(node)
            pem.write_text(key.read_text() + crt.read_text())
            pem.chmod(0o600)
        finally:
            for scratch in (key, csr, ext):
                scratch.unlink(missing_ok=True)


_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def _is_ip(host: str) -> bool:
    return host.replace(".", "").isdigit() or ":" in host


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PrerequisiteMissing("openssl is required to make the secured cluster's certificates, and `openssl` "
                                  "is not on PATH.")
    done = subprocess.run([openssl, *args], capture_output=True, text=True)
    if done.returncode != 0:
        why = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise BrokerStartFailed(f"making the cluster's certificates failed: openssl {args[0]}: {why}")
