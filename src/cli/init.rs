//! `seckill init`

use clap::Args;
use serde::Serialize;

use super::common::{Format, FormatOpt};
use super::render::{print_json, table};
use crate::exit_code;
use crate::store::config::Config;
use crate::store::db::{self, Db};
use crate::store::redis_conn;
use crate::store::schema::{self, MigrateReport};
use crate::support::mask::mask_url;

#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub format: FormatOpt,
}

#[derive(Serialize)]
struct Server {
    url: String,
    version: String,
}

#[derive(Serialize)]
struct InitReport {
    redis: Server,
    mysql: Server,
    database: String,
    schema: MigrateReport,
}

pub async fn run(cfg: &Config, args: InitArgs) -> anyhow::Result<u8> {
    let mut redis = redis_conn::connect(cfg).await?;
    let redis_version = redis_conn::check_version(&mut redis).await?;
    let database = Db::connect_for_init(cfg).await?;
    let mut conn = database.conn().await?;
    let mysql_version = db::check_version(&mut conn).await?;
    let migrated = schema::migrate(&mut conn).await?;
    drop(conn);
    let report = InitReport {
        redis: Server {
            url: mask_url(&cfg.redis_url),
            version: redis_version,
        },
        mysql: Server {
            url: mask_url(&cfg.mysql_url),
            version: mysql_version,
        },
        database: database.name().to_string(),
        schema: migrated,
    };
    database.close().await;
    match args.format.format {
        Format::Json => print_json(&report)?,
        Format::Table => outln!("{}", init_table(&report))?,
    }
    Ok(exit_code::OK)
}

fn init_table(r: &InitReport) -> comfy_table::Table {
    let mut t = table(&["", "where", "state"]);
    t.add_row(vec![
        "Redis",
        &r.redis.url,
        &format!("{} ok", r.redis.version),
    ]);
    t.add_row(vec![
        "MySQL",
        &r.mysql.url,
        &format!("{} ok", r.mysql.version),
    ]);
    let schema = if r.schema.applied.is_empty() {
        format!("version {}, up to date", r.schema.to)
    } else {
        format!(
            "version {} -> {} (applied: {})",
            r.schema.from,
            r.schema.to,
            r.schema.applied.join(", ")
        )
    };
    t.add_row(vec!["Schema", &r.database, &schema]);
    t
}
