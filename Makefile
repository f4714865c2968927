# The two commands of the README: `make demo` and `make test`. Everything else is theirs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv up down status demo test lint clean postgres

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@command -v java >/dev/null || { echo "Java 17+ is missing: apt-get install openjdk-17-jre-headless"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(STAMP)

up: venv
	@command -v mariadbd >/dev/null || test -x /usr/sbin/mariadbd || test -n "$$EO_MYSQL_HOST" || { \
	  command -v apt-get >/dev/null || { echo "MariaDB is missing and apt-get is not available: install mariadb-server or set EO_MYSQL_HOST"; exit 1; }; \
	  echo "installing MariaDB from Debian's packages"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client >/dev/null; }
	@command -v mvn >/dev/null || test -n "$$EO_KAFKA_BOOTSTRAP" || { echo "Maven is missing: apt-get install maven (needed to fetch Kafka from Maven Central)"; exit 1; }
	$(PY) scripts/stack.py up

down:
	@test -x $(PY) && $(PY) scripts/stack.py down || $(PYTHON) scripts/stack.py down

status:
	@$(PYTHON) scripts/stack.py status

demo: up
	. .stack/env && $(PY) scripts/demo.py

# The scheduler tests (tests/scheduler) run a throwaway PostgreSQL cluster as Airflow's metadata
# database (backfills refuse SQLite): they need Debian's server programs, not a running server.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "PostgreSQL is missing and apt-get is not available: install postgresql"; exit 1; }; \
	  echo "installing PostgreSQL from Debian's packages (metadata database of the scheduler tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

test: up postgres
	. .stack/env && $(PY) -m ruff check airflow_eo dags tests scripts
	. .stack/env && $(PY) -m pytest -ra $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check airflow_eo dags tests scripts

clean: down
	rm -rf .stack
