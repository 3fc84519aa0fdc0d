"""Throwaway PKI for the test control plane, made with the `openssl` CLI.

The openssl binary is used instead of a Python crypto library so the harness needs nothing beyond
the standard library (it must run before the project's own dependencies are installed). Keys are
P-256: generating them is ~100x faster than RSA, which matters for a <30 s warm start.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Extensions live in one config file so the result does not depend on the distribution's default
# openssl.cnf (whose [v3_ca] and -addext handling differ between OpenSSL 1.1 and 3).
_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt_names
[v3_client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
[alt_names]
{alt_names}
"""


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its private key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPKI:
    """Every certificate and key the control plane components need."""

    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    sa_key: Path
    """Service-account token signing key (private), shared by apiserver and controller-manager."""
    sa_pub: Path
    """Its public half, which the apiserver uses to verify tokens."""
    dir: Path
    """Where the files are; `client` issues more identities there."""

    def client(self, name: str, subject: str) -> KeyPair:
        """A client certificate for `subject` (e.g. `/O=system:nodes/CN=system:node:n1`)."""
        return _signed(self.dir, name, subject, "v3_client", self.ca, self.dir / "openssl.cnf")


def _openssl(*args: str | Path, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed:\n{proc.stderr}")


def _ec_key(path: Path) -> Path:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", path, cwd=path.parent)
    path.chmod(0o600)
    return path


def _signed(d: Path, name: str, subject: str, extensions: str, ca: KeyPair, cnf: Path) -> KeyPair:
    key = _ec_key(d / f"{name}.key")
    csr = d / f"{name}.csr"
    cert = d / f"{name}.crt"
    _openssl("req", "-new", "-key", key, "-subj", subject, "-config", cnf, "-out", csr, cwd=d)
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca.cert,
        "-CAkey",
        ca.key,
        "-set_serial",
        str(secrets.randbits(63)),
        "-days",
        "30",
        "-extfile",
        cnf,
        "-extensions",
        extensions,
        "-out",
        cert,
        cwd=d,
    )
    csr.unlink()
    return KeyPair(cert=cert, key=key)


def make_pki(
    d: Path, *, service_ip: str = "10.0.0.1", extra_ips: tuple[str, ...] = ()
) -> ClusterPKI:
    """Create a CA, serving/client certificates and the service-account key pair under `d`.

    `service_ip` is the first address of the service CIDR: in-cluster clients reach the apiserver
    through the `kubernetes` Service, so the serving certificate must name it. `extra_ips` are
    further addresses it listens on (the real node's side of the host).
    """
    d.mkdir(parents=True, exist_ok=True)
    alt = [
        "DNS.1 = localhost",
        "DNS.2 = kubernetes",
        "DNS.3 = kubernetes.default",
        "DNS.4 = kubernetes.default.svc",
        "DNS.5 = kubernetes.default.svc.cluster.local",
        "IP.1 = 127.0.0.1",
        f"IP.2 = {service_ip}",
        *(f"IP.{i} = {ip}" for i, ip in enumerate(extra_ips, start=3)),
    ]
    cnf = d / "openssl.cnf"
    cnf.write_text(_OPENSSL_CNF.format(alt_names="\n".join(alt)))

    ca_key = _ec_key(d / "ca.key")
    ca_cert = d / "ca.crt"
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        ca_key,
        "-subj",
        "/CN=impala-e2e-ca",
        "-days",
        "30",
        "-config",
        cnf,
        "-extensions",
        "v3_ca",
        "-out",
        ca_cert,
        cwd=d,
    )
    ca = KeyPair(cert=ca_cert, key=ca_key)

    sa_key = _ec_key(d / "sa.key")
    sa_pub = d / "sa.pub"
    _openssl("ec", "-in", sa_key, "-pubout", "-out", sa_pub, cwd=d)

    return ClusterPKI(
        ca=ca,
        apiserver=_signed(d, "apiserver", "/CN=kube-apiserver", "v3_server", ca, cnf),
        # O=system:masters is what makes this identity cluster-admin, as in kubeadm's admin.conf.
        admin=_signed(d, "admin", "/O=system:masters/CN=impala-e2e-admin", "v3_client", ca, cnf),
        # The bootstrap RBAC policy already binds roles to these exact user names.
        controller_manager=_signed(
            d, "controller-manager", "/CN=system:kube-controller-manager", "v3_client", ca, cnf
        ),
        scheduler=_signed(d, "scheduler", "/CN=system:kube-scheduler", "v3_client", ca, cnf),
        sa_key=sa_key,
        sa_pub=sa_pub,
        dir=d,
    )
