"""The Spark engine's token (engine/spark/engine.py): an engine on loopback accepts only clients holding the token
it made when it started, kept in a file of its user's alone; the project's clients read it. Real processes: the
engine (`spark_engine`, a Spark Connect server) and a gRPC client running as another user (uid 65534)."""

from __future__ import annotations

import os
import stat
import tempfile
import uuid
from pathlib import Path

import pytest
from pyspark.sql.connect.proto import base_pb2

from kafscale_lakehouse.config.spark_remote import ConnectAddress
from kafscale_lakehouse.engine.spark.engine import TOKEN_VARIABLE, create_engine_token, token_path, with_engine_token
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse.local_processes import DIRECTORY_VARIABLE
from kafscale_lakehouse_tests.engine.spark.other_user import OtherUser

pytestmark = pytest.mark.integration

# Calls the engine's Config method with the request given in hex, with the bearer token given (or none), and tries to
# read the token file given: what another local user could do.
OTHER_USER_CLIENT = """
import json, grpc
port, request, token, token_file = sys.argv[1:]
def config_call(token):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        channel.unary_unary("/spark.connect.SparkConnectService/Config")(bytes.fromhex(request), metadata=metadata,
                                                                        timeout=60)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name
    finally:
        channel.close()
def read(path):
    try:
        open(path).read()
        return "read"
    except PermissionError:
        return "denied"
print(json.dumps({"without": config_call(""), "wrong": config_call("not-the-token"), "with": config_call(token),
                  "token_file": read(token_file)}))
"""


def config_request() -> str:
    """A Config call reading `spark.app.name` in a session of its own."""
    request = base_pb2.ConfigRequest(
        session_id=str(uuid.uuid4()), user_context=base_pb2.UserContext(user_id="other"),
        operation=base_pb2.ConfigRequest.Operation(get=base_pb2.ConfigRequest.Get(keys=["spark.app.name"])))
    return request.SerializeToString().hex()


def test_the_engine_refuses_a_client_without_its_token(spark_engine: ConnectAddress, other_user: OtherUser):
    path = token_path(spark_engine.port)
    token = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The project's client reads the token file.
    assert with_engine_token(spark_engine.url).endswith(f";token={token}")
    assert get_spark_session(remote=spark_engine.url).range(3).count() == 3

    # Another user reaches the port, but without the token (or with another) no call is served, and the token file
    # is not theirs to read; handed the token, the same client is served.
    seen = other_user.run(OTHER_USER_CLIENT, str(spark_engine.port), config_request(), token, str(path))
    assert seen == {"without": "UNAUTHENTICATED", "wrong": "UNAUTHENTICATED", "with": "OK", "token_file": "denied"}


def test_the_token_file_is_its_users_alone_in_a_directory_others_can_enter(other_user: OtherUser):
    directory = Path(tempfile.mkdtemp(prefix="kafscale-engines-"))
    directory.chmod(0o755)  # KAFSCALE_SPARK_ENGINE_DIR may be one others can list and enter
    umask = os.umask(0)  # a umask that would leave a new file readable by all
    try:
        path, token = create_engine_token(15999, {DIRECTORY_VARIABLE: str(directory)})
        os.umask(umask)
        assert path == directory / "spark-engine-15999.token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text() == token and len(token) >= 32
        assert with_engine_token("sc://127.0.0.1:15999/;user_id=runs", {DIRECTORY_VARIABLE: str(directory)}) \
            == f"sc://localhost:15999/;user_id=runs;token={token}"
        assert with_engine_token("sc://engine:15999", {DIRECTORY_VARIABLE: str(directory)}) == "sc://engine:15999"
        # A client of another records directory is given the token in Spark Connect's variable.
        assert with_engine_token("sc://127.0.0.1:15999", {TOKEN_VARIABLE: "given"}) \
            == "sc://localhost:15999/;token=given"
        seen = other_user.run("import json\ntry:\n    open(sys.argv[1]).read()\n    print(json.dumps('read'))\n"
                              "except PermissionError:\n    print(json.dumps('denied'))", str(path))
        assert seen == "denied"
    finally:
        os.umask(umask)
        for leftover in directory.iterdir():
            leftover.unlink()
        directory.rmdir()
