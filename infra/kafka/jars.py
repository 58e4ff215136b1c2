"""The broker's prerequisites: a Java 17+ runtime, and its jars fetched once per version with Maven."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from infra.errors import FetchFailed, PrerequisiteMissing

POM = Path(__file__).parent / "pom.xml"
MIN_JAVA = 17


def find_java() -> str:
    """Path of a Java 17+ `java`, or one clear line saying what is missing."""
    java = shutil.which("java")
    if java is None:
        raise PrerequisiteMissing(f"Java {MIN_JAVA}+ is required to run Kafka, and `java` is not on PATH.")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0" is Java 8
        major = int(match.group(2))
    if major < MIN_JAVA:
        found = major or "unknown"
        raise PrerequisiteMissing(f"Java {MIN_JAVA}+ is required to run Kafka, found Java {found} at {java}.")
    return java


def fetched(libs: Path) -> bool:
    return (libs / ".complete").exists()


def fetch(libs: Path, version: str) -> Path:
    """Download Kafka `version` and its runtime dependencies into `libs`; a partial download is redone."""
    if fetched(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PrerequisiteMissing("Maven is required to fetch the Kafka broker, and `mvn` is not on PATH.")
    partial = libs.with_name(libs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
           f"-DoutputDirectory={partial.resolve()}", f"-Dkafka.version={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise FetchFailed(f"Maven could not fetch Kafka {version}: {tail}")
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    (libs / ".complete").touch()
    return libs
