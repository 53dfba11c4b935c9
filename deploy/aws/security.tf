# Who may talk to whom: clients -> NLB -> routers (6432); routers and load generators -> primaries
# (5432), primaries -> primaries (a split's replication); the routers' HTTP side port from the
# NLB (health checks), the VPC and the operator; the admin console from the operator. No SSH.

resource "aws_security_group" "nlb" {
  name        = "${var.name}-nlb"
  description = "Postgres clients to the routers' load balancer"
  vpc_id      = local.vpc_id
}

resource "aws_security_group" "router" {
  name        = "${var.name}-router"
  description = "shardgate routers"
  vpc_id      = local.vpc_id
}

resource "aws_security_group" "primary" {
  name        = "${var.name}-primary"
  description = "Shard primaries"
  vpc_id      = local.vpc_id
}

resource "aws_security_group" "loadgen" {
  name        = "${var.name}-loadgen"
  description = "Load generators"
  vpc_id      = local.vpc_id
}

resource "aws_vpc_security_group_ingress_rule" "clients_to_nlb" {
  for_each          = toset(var.client_cidrs)
  security_group_id = aws_security_group.nlb.id
  cidr_ipv4         = each.value
  from_port         = 6432
  to_port           = 6432
  ip_protocol       = "tcp"
}

resource "aws_vpc_security_group_ingress_rule" "loadgens_to_nlb" {
  security_group_id            = aws_security_group.nlb.id
  referenced_security_group_id = aws_security_group.loadgen.id
  from_port                    = 6432
  to_port                      = 6432
  ip_protocol                  = "tcp"
}

resource "aws_vpc_security_group_egress_rule" "nlb_to_routers" {
  for_each                     = toset(["6432", "9930"])
  security_group_id            = aws_security_group.nlb.id
  referenced_security_group_id = aws_security_group.router.id
  from_port                    = tonumber(each.value)
  to_port                      = tonumber(each.value)
  ip_protocol                  = "tcp"
}

resource "aws_vpc_security_group_ingress_rule" "nlb_to_routers" {
  for_each                     = toset(["6432", "9930"])
  security_group_id            = aws_security_group.router.id
  referenced_security_group_id = aws_security_group.nlb.id
  from_port                    = tonumber(each.value)
  to_port                      = tonumber(each.value)
  ip_protocol                  = "tcp"
}

resource "aws_vpc_security_group_ingress_rule" "operator_to_routers" {
  for_each          = { for pair in setproduct(var.operator_cidrs, ["6432", "9930"]) : "${pair[0]}:${pair[1]}" => pair }
  security_group_id = aws_security_group.router.id
  cidr_ipv4         = each.value[0]
  from_port         = tonumber(each.value[1])
  to_port           = tonumber(each.value[1])
  ip_protocol       = "tcp"
}

# Prometheus inside the VPC scrapes /metrics.
resource "aws_vpc_security_group_ingress_rule" "vpc_to_router_metrics" {
  security_group_id = aws_security_group.router.id
  cidr_ipv4         = var.vpc_cidr
  from_port         = 9930
  to_port           = 9930
  ip_protocol       = "tcp"
}

resource "aws_vpc_security_group_ingress_rule" "to_primaries" {
  for_each                     = { router = aws_security_group.router.id, loadgen = aws_security_group.loadgen.id, primary = aws_security_group.primary.id }
  security_group_id            = aws_security_group.primary.id
  referenced_security_group_id = each.value
  from_port                    = 5432
  to_port                      = 5432
  ip_protocol                  = "tcp"
}

# Out: packages (through the NAT), S3, SSM, and the paths above.
resource "aws_vpc_security_group_egress_rule" "all_out" {
  for_each          = { router = aws_security_group.router.id, primary = aws_security_group.primary.id, loadgen = aws_security_group.loadgen.id }
  security_group_id = each.value
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}
