-- MySQL/MariaDB users for seckill, least privilege. Before use: replace
-- `seckill` (the database of --mysql-url), the host pattern '%' and each
-- CHANGE-ME. Then give each process its user in the URL
-- (mysql://seckill_worker@db:3306/seckill) and the password with
-- --mysql-password-file. Run the first part, then `seckill init` as
-- seckill_init, then the rest. tests/least_privilege.rs applies this file.

-- `seckill init`: creates the database if missing and runs the migrations
-- (tables, indexes, the migration history).
CREATE USER IF NOT EXISTS 'seckill_init'@'%' IDENTIFIED BY 'CHANGE-ME';
GRANT CREATE, ALTER, INDEX, SELECT, INSERT, UPDATE ON `seckill`.* TO 'seckill_init'@'%';

-- == After `seckill init` has run: grants on a table need the table. ==

-- `seckill worker`: inserts orders and takes stock (layer 4), cancels
-- unpaid orders and gives the stock back (layer 5), reads the schema
-- version it checks at start.
CREATE USER IF NOT EXISTS 'seckill_worker'@'%' IDENTIFIED BY 'CHANGE-ME';
GRANT SELECT, INSERT, UPDATE ON `seckill`.`seckill_order` TO 'seckill_worker'@'%';
GRANT SELECT, UPDATE ON `seckill`.`seckill_voucher` TO 'seckill_worker'@'%';
GRANT SELECT ON `seckill`.`seckill_schema_history` TO 'seckill_worker'@'%';
-- `seckill serve` runs as the worker: an Idempotency-Key on a payment
-- takes, records and (past its lifetime) deletes its row.
GRANT SELECT, INSERT, UPDATE, DELETE ON `seckill`.`seckill_payment_key` TO 'seckill_worker'@'%';

-- Operators: `status`, `pending`, `reconcile` (with repair: the gate is in
-- Redis; --fix-mysql sets a voucher's stock), `voucher add/update`, `pay`,
-- `order show`, `preload`.
CREATE USER IF NOT EXISTS 'seckill_operator'@'%' IDENTIFIED BY 'CHANGE-ME';
GRANT SELECT ON `seckill`.* TO 'seckill_operator'@'%';
GRANT INSERT, UPDATE ON `seckill`.`seckill_voucher` TO 'seckill_operator'@'%';
GRANT UPDATE ON `seckill`.`seckill_order` TO 'seckill_operator'@'%';
