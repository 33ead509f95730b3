//! `distlock group`: a group's members and partition map, each partition with its owner and
//! fence; `distlock owner`: who owns a key, for scripts and routers.

use clap::Args;
use distlock::{KeyOwner, Member, PartitionState};

use crate::exit;

#[derive(Debug, Args)]
pub(crate) struct GroupArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// The group's number of partitions, as its members joined with.
    #[arg(long, default_value_t = distlock::DEFAULT_PARTITIONS, value_name = "P")]
    partitions: u32,
    /// One JSON object: group, partitions, members (id, value, epoch) and map (partition,
    /// owner, fence, assigned).
    #[arg(long)]
    json: bool,
    /// The group's name.
    name: String,
}

#[derive(Debug, Args)]
pub(crate) struct OwnerArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// The group's number of partitions, as its members joined with.
    #[arg(long, default_value_t = distlock::DEFAULT_PARTITIONS, value_name = "P")]
    partitions: u32,
    /// One JSON object: key, partition, member, value, fence (null between two owners).
    #[arg(long)]
    json: bool,
    /// The group's name.
    name: String,
    /// The key.
    key: String,
}

pub(crate) async fn group(args: GroupArgs) -> u8 {
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let group = client.group(&args.name).partitions(args.partitions);
    let members = match group.members().await {
        Ok(m) => m,
        Err(e) => return exit::report("cannot read the group's members", &e),
    };
    let map = match group.partition_map().await {
        Ok(m) => m,
        Err(e) => return exit::report("cannot read the group's partitions", &e),
    };
    print!(
        "{}",
        show_group(&args.name, args.partitions, &members, &map, args.json)
    );
    0
}

pub(crate) async fn owner(args: OwnerArgs) -> u8 {
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let group = client.group(&args.name).partitions(args.partitions);
    match group.owner_of(&args.key).await {
        Ok(Some(o)) => {
            print!("{}", show_owner(&args.key, &o, args.json));
            0
        }
        Ok(None) => {
            if args.json {
                let v = serde_json::json!({
                    "key": args.key,
                    "partition": group.partition_of(&args.key),
                    "member": null,
                });
                println!("{v}");
            } else {
                println!(
                    "{}: partition {}, no owner (the group has no member)",
                    args.key,
                    group.partition_of(&args.key)
                );
            }
            exit::UNAVAILABLE
        }
        Err(e) => exit::report("cannot read the key's owner", &e),
    }
}

fn show_group(
    name: &str,
    partitions: u32,
    members: &[Member],
    map: &[PartitionState],
    json: bool,
) -> String {
    if json {
        let v = serde_json::json!({
            "group": name,
            "partitions": partitions,
            "members": members.iter().map(|m| serde_json::json!({
                "id": m.id,
                "value": m.value,
                "epoch": m.epoch.get(),
            })).collect::<Vec<_>>(),
            "map": map.iter().map(|p| serde_json::json!({
                "partition": p.partition,
                "owner": p.holder,
                "fence": p.fence.map(distlock::Fence::get),
                "assigned": p.assigned,
            })).collect::<Vec<_>>(),
        });
        return format!("{v}\n");
    }
    let held = map.iter().filter(|p| p.holder.is_some()).count();
    let moving = map
        .iter()
        .filter(|p| p.holder.is_some() && p.holder != p.assigned)
        .count();
    let mut out = format!(
        "group {name}: {} member(s), {partitions} partitions, {held} owned, {moving} moving\n",
        members.len()
    );
    if !members.is_empty() {
        let mut owns: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for holder in map.iter().filter_map(|p| p.holder.as_deref()) {
            *owns.entry(holder).or_default() += 1;
        }
        out.push_str("\nMEMBER\tEPOCH\tPARTITIONS\tVALUE\n");
        for m in members {
            let n = owns.get(m.id.as_str()).copied().unwrap_or(0);
            out.push_str(&format!("{}\t{}\t{n}\t{}\n", m.id, m.epoch, m.value));
        }
    }
    out.push_str("\nPARTITION\tOWNER\tFENCE\tASSIGNED\n");
    for p in map {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            p.partition,
            p.holder.as_deref().unwrap_or("-"),
            p.fence.map_or("-".to_owned(), |f| f.to_string()),
            p.assigned.as_deref().unwrap_or("-"),
        ));
    }
    out
}

fn show_owner(key: &str, o: &KeyOwner, json: bool) -> String {
    if json {
        let v = serde_json::json!({
            "key": key,
            "partition": o.partition,
            "member": o.member,
            "value": o.value,
            "fence": o.fence.map(distlock::Fence::get),
        });
        return format!("{v}\n");
    }
    let value = if o.value.is_empty() {
        String::new()
    } else {
        format!(" ({})", o.value)
    };
    match o.fence {
        Some(f) => format!(
            "{key}: partition {}, owned by {}{value} at fence {f}\n",
            o.partition, o.member
        ),
        None => format!(
            "{key}: partition {}, assigned to {}{value}, not held yet\n",
            o.partition, o.member
        ),
    }
}
