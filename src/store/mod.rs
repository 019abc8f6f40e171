//! Where the data lives and how to reach it: connection settings, the MySQL
//! pool, schema and the SQL that counts orders, the Redis connection, the key layout, the embedded Lua
//! scripts and the voucher registry.

pub mod config;
pub mod counter_sql;
pub mod db;
pub mod keys;
pub mod layout;
pub mod mysql_tls;
pub mod node_lease;
pub mod redis_conn;
pub mod registry;
pub mod reply;
pub mod schema;
pub mod scripts;
pub mod secret_file;
pub mod slot_map;
