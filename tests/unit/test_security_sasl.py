"""The SASL mechanisms (mqk.broker.security.scram, .sasl) alone: RFC 7677's SCRAM-SHA-256 example byte for byte,
both sides; SCRAM-SHA-512 end to end; librdkafka's repeated client nonce; every refusal as AuthenticationFailed (and
nothing else); PLAIN against SCRAM credentials."""

from __future__ import annotations

import base64

import pytest

from mqk.broker.security.errors import AuthenticationFailed
from mqk.broker.security.sasl import PlainServer, new_server
from mqk.broker.security.scram import (
    MECHANISMS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramClient,
    ScramServer,
    decode_saslname,
    encode_saslname,
    new_credential,
)

# RFC 7677 section 3: user "user", password "pencil"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
MOCK_KEY = b"k" * 32


def rfc_credential():
    return SCRAM_SHA_256.credential(SCRAM_SHA_256.salted_password("pencil", RFC_SALT, 4096), RFC_SALT, 4096)


def rfc_server(**kw) -> ScramServer:
    users = {"user": rfc_credential()}
    return ScramServer(SCRAM_SHA_256, users.get, mock_key=MOCK_KEY, nonce=RFC_SERVER_NONCE, **kw)


def test_rfc7677_server_side_byte_for_byte():
    server = rfc_server()
    assert server.evaluate(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete
    assert server.evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.username == "user"


def test_rfc7677_client_side_byte_for_byte():
    client = ScramClient(SCRAM_SHA_256, "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)
    with pytest.raises(AuthenticationFailed):
        client.verify(b"v=" + base64.b64encode(b"\x00" * 32))


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_client_and_server_agree_for_both_mechanisms_and_escaped_names(mechanism):
    scram = MECHANISMS[mechanism]
    name = "a,b=c"  # escaped as a=2Cb=3Dc on the wire
    users = {name: new_credential(scram, "s3cret")}
    server = ScramServer(scram, users.get, mock_key=MOCK_KEY)
    client = ScramClient(scram, name, "s3cret")
    assert b"n=a=2Cb=3Dc," in client.first()
    client.verify(server.evaluate(client.final(server.evaluate(client.first()))))
    assert server.complete and server.username == name


def test_the_librdkafka_client_nonce_repeated_is_accepted_and_nothing_else():
    """librdkafka before 2.6.1 puts its own nonce in front of the server's whole nonce again; its proof is over that
    message, and Kafka 3.8.1 accepted it (Debian's kcat runs such a librdkafka)."""
    cnonce = "rOprNGfwEbeRWgbNEkqO"

    def final_with(nonce: str) -> bytes:
        """A client-final message carrying `nonce`, its proof over exactly that message (as librdkafka signs it)."""
        without = f"c=biws,r={nonce}"
        auth = b",".join([RFC_CLIENT_FIRST[3:], RFC_SERVER_FIRST, without.encode()])
        salted = SCRAM_SHA_256.salted_password("pencil", RFC_SALT, 4096)
        client_key = SCRAM_SHA_256.hmac(salted, b"Client Key")
        signature = SCRAM_SHA_256.hmac(SCRAM_SHA_256.hash(client_key), auth)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        return f"{without},p={base64.b64encode(proof).decode()}".encode()

    assert final_with(cnonce + RFC_SERVER_NONCE) == RFC_CLIENT_FINAL  # the helper signs as a client does
    server = rfc_server()
    server.evaluate(RFC_CLIENT_FIRST)
    server.evaluate(final_with(cnonce + cnonce + RFC_SERVER_NONCE))  # the repeated nonce: accepted
    assert server.complete
    for wrong in (cnonce, RFC_SERVER_NONCE + cnonce, "x" + cnonce + RFC_SERVER_NONCE, cnonce + cnonce):
        server = rfc_server()
        server.evaluate(RFC_CLIENT_FIRST)
        with pytest.raises(AuthenticationFailed, match="nonce"):
            server.evaluate(final_with(wrong))


def test_a_wrong_password_fails_at_the_proof():
    server = rfc_server()
    client = ScramClient(SCRAM_SHA_256, "user", "pencil!")
    with pytest.raises(AuthenticationFailed, match="invalid credentials"):
        server.evaluate(client.final(server.evaluate(client.first())))
    with pytest.raises(AuthenticationFailed):  # the exchange is over
        server.evaluate(RFC_CLIENT_FINAL)


def test_an_unknown_user_gets_a_salt_like_anyone_and_fails_only_at_the_proof():
    def first_salt(user: str) -> bytes:
        server = ScramServer(SCRAM_SHA_512, {}.get, mock_key=MOCK_KEY)
        answer = server.evaluate(ScramClient(SCRAM_SHA_512, user, "x").first()).decode()
        return base64.b64decode(answer.split(",s=")[1].split(",")[0])

    assert first_salt("ghost") == first_salt("ghost") != first_salt("phantom")
    assert len(first_salt("ghost")) == 32
    server = ScramServer(SCRAM_SHA_512, {}.get, mock_key=MOCK_KEY)
    client = ScramClient(SCRAM_SHA_512, "ghost", "x")
    with pytest.raises(AuthenticationFailed):
        server.evaluate(client.final(server.evaluate(client.first())))


@pytest.mark.parametrize(
    "first",
    [
        b"",
        b"n,,",
        b"n,,n=user",
        b"n,,r=abc",
        b"p=tls-unique,,n=user,r=abc",  # channel binding: not offered
        b"n,a=other,n=user,r=abc",  # acting for another user
        b"n,,n=us=er,r=abc",  # a bad saslname escape
        b"n,,n=user,r=ab,c",
        b"n,,n=user,r=abc,tokenauth=true",  # delegation tokens
        b"\xff\xfe",
        b"n,,n=,r=abc",
    ],
)
def test_malformed_or_refused_client_first_messages(first):
    with pytest.raises(AuthenticationFailed):
        rfc_server().evaluate(first)


@pytest.mark.parametrize(
    "final",
    [
        b"",
        RFC_CLIENT_FINAL[:-10],
        RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"),  # claims a y,, header
        RFC_CLIENT_FINAL.replace(b"c=biws", b"c=b!ws"),
        RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=dHzc"),
        RFC_CLIENT_FINAL.split(b",p=")[0] + b",p=" + base64.b64encode(b"short"),
        RFC_CLIENT_FINAL + b",x=1",
    ],
)
def test_malformed_or_wrong_client_final_messages(final):
    server = rfc_server()
    server.evaluate(RFC_CLIENT_FIRST)
    with pytest.raises(AuthenticationFailed):
        server.evaluate(final)


def test_the_authorization_id_may_name_the_user_itself_and_extensions_are_allowed():
    server = rfc_server()
    first = b"n,a=user,n=user,r=rOprNGfwEbeRWgbNEkqO,ext=1"
    server_first = server.evaluate(first)
    assert server_first == RFC_SERVER_FIRST


def test_saslname_escapes():
    assert encode_saslname("a=b,c") == "a=3Db=2Cc"
    assert decode_saslname("a=3Db=2Cc") == "a=b,c"
    with pytest.raises(AuthenticationFailed):
        decode_saslname("a=4Fb")


def credentials_of(users):
    return lambda user, mechanism: users.get((user, mechanism.name))


def test_plain_checks_the_password_against_either_scram_credential():
    users = {
        ("alice", "SCRAM-SHA-256"): new_credential(SCRAM_SHA_256, "pw"),
        ("bob", "SCRAM-SHA-512"): new_credential(SCRAM_SHA_512, "pw2"),
    }
    for token, user in ((b"\x00alice\x00pw", "alice"), (b"bob\x00bob\x00pw2", "bob")):
        server = PlainServer(credentials_of(users))
        assert server.blocking and server.evaluate(token) == b"" and server.complete and server.username == user
    for token in (
        b"\x00alice\x00wrong",
        b"\x00carol\x00pw",
        b"bob\x00alice\x00pw",  # acting for another user
        b"\x00alice\x00",
        b"\x00\x00pw",
        b"alice\x00pw",
        b"\x00alice\x00pw\x00",
        b"\x00\xffalice\x00pw",
    ):
        with pytest.raises(AuthenticationFailed):
            PlainServer(credentials_of(users)).evaluate(token)
    server = PlainServer(credentials_of(users))
    server.evaluate(b"\x00alice\x00pw")
    with pytest.raises(AuthenticationFailed):
        server.evaluate(b"\x00alice\x00pw")


def test_a_user_with_only_one_scram_mechanism_is_unknown_to_the_other():
    users = {("alice", "SCRAM-SHA-256"): new_credential(SCRAM_SHA_256, "pw")}
    server = new_server("SCRAM-SHA-512", credentials_of(users), MOCK_KEY)
    client = ScramClient(SCRAM_SHA_512, "alice", "pw")
    with pytest.raises(AuthenticationFailed):
        server.evaluate(client.final(server.evaluate(client.first())))
    server = new_server("SCRAM-SHA-256", credentials_of(users), MOCK_KEY)
    client = ScramClient(SCRAM_SHA_256, "alice", "pw")
    client.verify(server.evaluate(client.final(server.evaluate(client.first()))))


def test_the_client_refuses_a_server_that_does_not_extend_its_nonce_or_asks_too_few_iterations():
    client = ScramClient(SCRAM_SHA_256, "user", "pencil", nonce="abc")
    for server_first in (b"r=abc,s=AAAA,i=4096", b"r=xyzabc,s=AAAA,i=4096", b"r=abcd,s=AAAA,i=1000", b"r=abcd,s=AAAA"):
        with pytest.raises(AuthenticationFailed):
            client.final(server_first)
