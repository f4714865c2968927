-- Runs once, on the first start of an empty data volume, after the image's
-- entrypoint has created MYSQL_DATABASE and MYSQL_USER (see docker-compose.yaml).
--
-- The XA sink must run `XA RECOVER` at the start of every attempt to find and
-- resolve prepared branches left by crashed attempts; MySQL 8 only shows other
-- sessions' branches to users holding XA_RECOVER_ADMIN.
GRANT XA_RECOVER_ADMIN ON *.* TO 'airflow_eo'@'%';
