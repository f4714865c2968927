# The two commands of the README: `make demo` and `make test`. Everything else is theirs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A slow or dropped answer of the package index is retried instead of failing the resolution (pip's default: 15 s,
# 5 retries; seen: a resolution that found "no matching distribution" for jinja2 on a slow index, then backtracked).
PIP_NET ?= --timeout 120 --retries 10
# What is missing comes from Debian's packages (Java, Maven, MariaDB, PostgreSQL).
APT_INSTALL := apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq

.PHONY: venv up down status connect demo bench soak test lint docs docs-serve clean postgres chromium java maven spark-cluster spark-cluster-down lane-2-up

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt | java
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_NET) --upgrade pip
	$(PY) -m pip install -q $(PIP_NET) -c constraints.txt -e '.[test]'
	@touch $(STAMP)

# Spark and Kafka run on Java 17+: default-jre-headless is OpenJDK 17 on Debian 12, 21 on Debian 13.
java:
	@command -v java >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "Java is missing and apt-get is not available: install a Java 17+ runtime"; exit 1; }; \
	  echo "installing Java (default-jre-headless) from Debian's packages"; \
	  $(APT_INSTALL) default-jre-headless >/dev/null; }

# Maven fetches Kafka's jars and Spark's Kafka connector from Maven Central. Not checked with
# EO_KAFKA_BOOTSTRAP (no local Kafka; without mvn, Spark asks Ivy for the connector).
maven: java
	@command -v mvn >/dev/null || test -n "$$EO_KAFKA_BOOTSTRAP" || { \
	  command -v apt-get >/dev/null || { echo "Maven is missing and apt-get is not available: install maven or set EO_KAFKA_BOOTSTRAP"; exit 1; }; \
	  echo "installing Maven from Debian's packages"; \
	  $(APT_INSTALL) maven >/dev/null; }

up: venv maven postgres
	@command -v mariadbd >/dev/null || test -x /usr/sbin/mariadbd || test -n "$$EO_MYSQL_HOST" || { \
	  command -v apt-get >/dev/null || { echo "MariaDB is missing and apt-get is not available: install mariadb-server or set EO_MYSQL_HOST"; exit 1; }; \
	  echo "installing MariaDB from Debian's packages"; \
	  $(APT_INSTALL) mariadb-server mariadb-client >/dev/null; }
	$(PY) scripts/stack.py up

# A Kafka Connect worker (distributed mode, REST on 127.0.0.1:28083 or EO_STACK_CONNECT_PORT) with Debezium's
# PostgreSQL and MariaDB connectors, jars from Maven Central (scripts/stack_connect.py); `down` stops it.
# Harmless when it runs.
connect: up
	$(PY) scripts/stack.py connect

down:
	@test ! -d .stack/lane-2 || { test -x $(PY) && $(LANE_2) $(PY) scripts/stack.py down || $(LANE_2) $(PYTHON) scripts/stack.py down; }
	@test -x $(PY) && $(PY) scripts/stack.py down || $(PYTHON) scripts/stack.py down

status:
	@$(PYTHON) scripts/stack.py status

# A standalone Spark cluster (master + 2 workers) and two Spark Connect servers on loopback, from the
# installed pyspark; the executors' Python is a second venv, .stack/spark-worker-venv. Settings: .stack/spark/env.
spark-cluster: venv maven
	$(PY) scripts/spark_cluster.py up

spark-cluster-down:
	@test -x $(PY) && $(PY) scripts/spark_cluster.py down || $(PYTHON) scripts/spark_cluster.py down

demo: up
	. .stack/env && $(PY) scripts/demo.py

# The benchmark of docs/explanation/benchmark.md: our sinks, the at-least-once peers and the limits on 1,000,000 events;
# BENCH_ARGS to change it (e.g. BENCH_ARGS="--sizes 10000,100000,1000000 --parallelism 2,4").
BENCH_ARGS ?= --sizes 1000000 --json bench.json --chart docs/benchmark.png
bench: up
	. .stack/env && $(PY) scripts/benchmark.py $(BENCH_ARGS)

# The soak of docs/explanation/faults.md: hours with the defaults (1,000,000 events, 100 kills).
SOAK_ARGS ?= --events 1000000 --kills 100
soak: up
	. .stack/env && $(PY) scripts/soak.py $(SOAK_ARGS)

# The stack's PostgreSQL (offset store and sinks; unless EO_PG_HOST names your server) and the scheduler tests'
# throwaway metadata database (tests/scheduler: backfills refuse SQLite) run Debian's server programs.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "PostgreSQL is missing and apt-get is not available: install postgresql or set EO_PG_HOST"; exit 1; }; \
	  echo "installing PostgreSQL from Debian's packages"; \
	  $(APT_INSTALL) postgresql >/dev/null; }

# The UI tab's browser test (tests/ui) drives Debian's headless Chromium through its chromedriver.
chromium:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "Chromium is missing and apt-get is not available: install chromium and chromium-driver"; exit 1; }; \
	  echo "installing Chromium and its chromedriver from Debian's packages (browser test of the UI tab)"; \
	  $(APT_INSTALL) chromium chromium-driver >/dev/null; }

# `make test` runs the suite in TEST_LANES pytest-xdist workers, each on a stack of its own (tests/support/lanes.py):
# lane 1 is `make up`'s .stack, lane 2 .stack/lane-2 on the ports of LANE_2. Tests that use the example DAGs' fixed
# topics and tables, or SIGKILL a server, then never meet another lane's. One lane (one process, one stack) when
# the services are your own (EO_KAFKA_BOOTSTRAP, EO_MYSQL_HOST, EO_PG_HOST), or with TEST_LANES=1.
TEST_LANES ?= $(if $(EO_KAFKA_BOOTSTRAP)$(EO_MYSQL_HOST)$(EO_PG_HOST),1,2)
LANE_2 = EO_STACK_DIR=$(CURDIR)/.stack/lane-2 EO_STACK_KAFKA_PORT=29492 EO_STACK_MYSQL_PORT=23506 \
  EO_STACK_PG_PORT=25632 EO_STACK_CONNECT_PORT=28283 EO_STACK_KAFKA_CLUSTER_PORT=29592
LANES_ARGS = $(if $(filter 1,$(TEST_LANES)),,-n $(TEST_LANES))

# Lane 2 starts in the background while the checks run (both mostly wait on one core each); its output is shown
# once it is up, and a lane that did not start stops the target before pytest.
LANE_2_LOG = .stack/lane-2-up.log
test: up postgres chromium
	@rm -f $(LANE_2_LOG) $(LANE_2_LOG).rc
	$(if $(filter 1,$(TEST_LANES)),,( env -u EO_KAFKA_BOOTSTRAP -u EO_MYSQL_HOST -u EO_PG_HOST $(LANE_2) \
	  $(PY) scripts/stack.py up > $(LANE_2_LOG) 2>&1; echo $$? > $(LANE_2_LOG).rc ) > /dev/null 2>&1 &)
	. .stack/env && $(PY) -m ruff check airflow_eo dags tests scripts examples
	. .stack/env && $(PY) -m mypy
	. .stack/env && $(VENV)/bin/lint-imports
	$(if $(filter 1,$(TEST_LANES)),,@while [ ! -s $(LANE_2_LOG).rc ]; do sleep 1; done; cat $(LANE_2_LOG); \
	  exit $$(cat $(LANE_2_LOG).rc))
	. .stack/env && $(PY) -m pytest -ra $(LANES_ARGS) $(PYTEST_ARGS)

# The second lane's stack (see TEST_LANES); `down` and `clean` take it with lane 1's.
lane-2-up: up
	env -u EO_KAFKA_BOOTSTRAP -u EO_MYSQL_HOST -u EO_PG_HOST $(LANE_2) $(PY) scripts/stack.py up

# mypy's files and strictness are in pyproject.toml ([tool.mypy]).
lint: venv
	$(PY) -m ruff check airflow_eo dags tests scripts examples
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml, docs/; docs/development/building-docs.md): built into site/ with --strict, so
# a warning, a broken link or a missing anchor fails; served on loopback only (DOCS_PORT to change the port).
DOCS_PORT ?= 8000
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# .stack, and the folder under /var/tmp that holds PostgreSQL's data when the clone's folder is closed to others.
clean: spark-cluster-down
	@test ! -d .stack/lane-2 || { test -x $(PY) && $(LANE_2) $(PY) scripts/stack.py clean || $(LANE_2) $(PYTHON) scripts/stack.py clean; }
	@test -x $(PY) && $(PY) scripts/stack.py clean || $(PYTHON) scripts/stack.py clean
