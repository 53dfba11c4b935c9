# The routers: a launch template and an auto-scaling group over the zones, behind a Network
# Load Balancer on 6432 whose health check is the router's /ready (so a draining router leaves
# the rotation before it closes its listener) and whose deregistration delay is the router's
# drain timeout.

resource "aws_launch_template" "router" {
  name_prefix            = "${var.name}-router-"
  image_id               = data.aws_ami.debian.id
  instance_type          = var.router_instance_type
  key_name               = var.key_name
  vpc_security_group_ids = [aws_security_group.router.id]

  iam_instance_profile {
    name = aws_iam_instance_profile.fleet.name
  }

  metadata_options {
    http_tokens = "required"
  }

  user_data = base64encode(templatefile("${path.module}/templates/router-init.sh.tftpl", {
    artifact_uri   = local.artifact_uri
    region         = var.region
    shardmap_uri   = local.shardmap_uri
    config_b64     = base64encode(module.config.router_toml)
    stop_timeout_s = module.config.deregistration_delay_s + 30
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-router", Role = "router" }
  }
}

resource "aws_lb" "routers" {
  name               = "${var.name}-routers"
  internal           = true
  load_balancer_type = "network"
  subnets            = aws_subnet.client[*].id
  security_groups    = [aws_security_group.nlb.id]

  enable_cross_zone_load_balancing = true
}

resource "aws_lb_target_group" "routers" {
  name                 = "${var.name}-routers"
  port                 = 6432
  protocol             = "TCP"
  vpc_id               = local.vpc_id
  deregistration_delay = module.config.deregistration_delay_s

  health_check {
    protocol            = "HTTP"
    port                = "9930"
    path                = "/ready"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }
}

resource "aws_lb_listener" "postgres" {
  load_balancer_arn = aws_lb.routers.arn
  port              = 6432
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.routers.arn
  }
}

resource "aws_autoscaling_group" "routers" {
  name                = "${var.name}-routers"
  min_size            = var.router_count
  max_size            = var.router_count
  desired_capacity    = var.router_count
  vpc_zone_identifier = aws_subnet.client[*].id
  target_group_arns   = [aws_lb_target_group.routers.arn]
  # EC2, not ELB: /ready stays 503 until every shard has answered, and one slow primary must
  # not make the group replace every router; the NLB's own /ready check keeps them out of
  # rotation until then.
  health_check_type = "EC2"

  health_check_grace_period = 300

  launch_template {
    id      = aws_launch_template.router.id
    version = aws_launch_template.router.latest_version
  }

  # Primaries first: routers start fine without them (statements wait, /ready reports), but
  # their names must resolve.
  depends_on = [
    aws_route53_record.primary,
    aws_route_table_association.client,
    aws_vpc_endpoint.s3,
    aws_iam_role_policy.fleet,
    aws_iam_role_policy_attachment.ssm,
  ]

  tag {
    key                 = "Fleet"
    value               = var.name
    propagate_at_launch = true
  }
}
