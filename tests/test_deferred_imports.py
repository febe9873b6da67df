"""LanceDB's REST-client package is registered without its __init__ (the API classes an embedded index never
uses) and still gives whoever asks for them the whole package."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess


def run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_lancedb_works_without_the_rest_clients_api_classes_and_they_load_on_first_use(tmp_path):
    done = run(
        "import sys, lexgraph, lancedb, pyarrow as pa\n"
        f"db = lancedb.connect({str(tmp_path)!r})\n"
        "db.create_table('t', pa.table({'x': [1, 2]}))\n"
        "assert db.open_table('t').count_rows() == 2\n"
        "assert 'lance_namespace_urllib3_client.api' not in sys.modules, 'API classes imported'\n"
        "import lance_namespace_urllib3_client as client\n"
        "assert getattr(client, '__wrapped__', None) is None  # a dunder probe (inspect, pickle) does not load it\n"
        "assert 'lance_namespace_urllib3_client.api' not in sys.modules, 'a dunder lookup ran the __init__'\n"
        "assert client.ApiClient and client.TableApi, 'the __init__ names'\n"
        "assert 'lance_namespace_urllib3_client.api' in sys.modules\n"
        "from lance_namespace_urllib3_client import Configuration\n"
        "try:\n"
        "    client.no_such_name\n"
        "except AttributeError as error:\n"
        "    assert 'no_such_name' in str(error)\n"
        "else:\n"
        "    raise SystemExit('a missing name was found')\n")
    assert done.returncode == 0, done.stderr


def test_a_package_already_imported_or_not_a_package_is_left_alone():
    done = run(
        "import sys, lance_namespace_urllib3_client as real\n"
        "from lexgraph.deferred_imports import defer_rest_client_package\n"
        "assert not defer_rest_client_package()\n"
        "assert sys.modules['lance_namespace_urllib3_client'] is real\n"
        "assert not defer_rest_client_package('json')  # a module, not a package\n"
        "assert not defer_rest_client_package('no_such_package_here')\n")
    assert done.returncode == 0, done.stderr
