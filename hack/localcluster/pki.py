"""The cluster's PKI: an ECDSA P-256 CA, the apiserver's serving certificate, one client certificate per
component, the service-account key pair, and kubeconfigs that point at them."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .layout import SERVICE_CIDR


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def dn(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int, *, ca: bool
) -> x509.CertificateBuilder:
    """What CA and leaf certificates share: names, key, validity, basic constraints and key usage."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def issue_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    *,
    server: bool,
    sans: list[x509.GeneralName] | None = None,
    days: int = 365,
) -> x509.Certificate:
    builder = (
        _builder(subject, ca_cert.subject, key, days, ca=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # file stem: (CN, O). RBAC's bootstrap policy binds the scheduler's and controller-manager's users;
    # the admin and kwok (which simulates a kubelet for every node it manages) are system:masters.
    "admin": ("gpulane-admin", ("system:masters",)),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kwok": ("kwok", ("system:masters",)),
}


def new_ca(cn: str, days: int = 3650) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate."""
    ca_key = new_key()
    cert = (
        _builder(dn(cn), dn(cn), ca_key, days, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, cert


def generate_pki(
    pki: Path, extra_ips: tuple[str, ...] = (), extra_clients: dict[str, tuple[str, tuple[str, ...]]] | None = None
) -> None:
    """CA, apiserver serving cert (IP SANs 127.0.0.1, the first service IP and ``extra_ips``; DNS localhost
    and kubernetes.default...), client certs (CLIENTS and ``extra_clients``), service-account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = new_ca("gpulane-local-ca")
    write_key(pki / "ca.key", ca_key)
    write_cert(pki / "ca.crt", ca_cert)

    first_service_ip = next(ipaddress.IPv4Network(SERVICE_CIDR).hosts())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(first_service_ip),
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ]
    key = new_key()
    write_key(pki / "apiserver.key", key)
    write_cert(pki / "apiserver.crt", issue_cert(ca_key, ca_cert, key, dn("kube-apiserver"), server=True, sans=sans))

    for stem, (cn, orgs) in {**CLIENTS, **(extra_clients or {})}.items():
        key = new_key()
        write_key(pki / f"{stem}.key", key)
        write_cert(pki / f"{stem}.crt", issue_cert(ca_key, ca_cert, key, dn(cn, orgs), server=False))

    sa_key = new_key()
    write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with absolute paths to the CA and the client cert/key of ``user`` (a client's stem)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpulane-local",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "gpulane-local", "context": {"cluster": "gpulane-local", "user": user}}],
        "current-context": "gpulane-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
