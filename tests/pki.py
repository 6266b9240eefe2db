"""Test certificates, made at test time with the `cryptography` package (no key is ever committed).

`make_pki(directory)` writes PEM files and returns their paths (`Pki`):
- `ca`: the test CA; `server` / `server_key`: the broker's certificate, for 127.0.0.1, ::1 and localhost (clients that
  check host names, librdkafka's default among them, accept it);
- `client(name)`: a client certificate `CN=<name>,OU=test,O=mqk` signed by the CA (key in `<name>.key`);
- `expired_client`: the same for user `late`, valid only in the past;
- `rogue_client`: user `alice` again, but signed by another CA the broker does not trust.

EC P-256 keys: made in microseconds, and every client here (OpenSSL through Python, librdkafka, Node) takes them.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mqk"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "test"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


@dataclass
class _Issuer:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey


def _ca(directory: Path, stem: str, cn: str) -> tuple[_Issuer, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{stem}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return _Issuer(cert.subject, key), path


def _leaf(
    directory: Path,
    stem: str,
    cn: str,
    issuer: _Issuer,
    *,
    server: bool,
    valid_days: tuple[int, int] = (-1, 30),
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=valid_days[0]))
        .not_valid_after(now + datetime.timedelta(days=valid_days[1]))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
    cert = builder.sign(issuer.key, hashes.SHA256())
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


@dataclass
class Pki:
    directory: Path
    ca: Path
    server: Path
    server_key: Path
    expired_client: tuple[Path, Path]
    rogue_client: tuple[Path, Path]
    _issuer: _Issuer

    def client(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of a client certificate for user `name`, signed by the test CA."""
        cert = self.directory / f"client-{name}.pem"
        if cert.exists():
            return cert, self.directory / f"client-{name}.key"
        return _leaf(self.directory, f"client-{name}", name, self._issuer, server=False)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    issuer, ca = _ca(directory, "ca", "mqk test CA")
    server, server_key = _leaf(directory, "server", "localhost", issuer, server=True)
    expired = _leaf(directory, "client-late", "late", issuer, server=False, valid_days=(-30, -1))
    rogue_issuer, _rogue_ca = _ca(directory, "rogue-ca", "rogue CA")
    rogue = _leaf(directory, "client-rogue", "alice", rogue_issuer, server=False)
    return Pki(directory, ca, server, server_key, expired, rogue, issuer)
