// Runs IAM requests through @cloud-copilot/iam-simulate (AWS's evaluation logic: every condition
// operator, IfExists, Null, permission boundaries). Reads {"policies": [{name, policy}], "boundary":
// policy|null, "requests": [{action, resource, context}]} on stdin; prints one result per request:
// {"decision": "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied" | "error", "ignored": [...], "errors": ...}.
import { runSimulation } from '@cloud-copilot/iam-simulate'

const ACCOUNT = '123456789012'
const PRINCIPAL = `arn:aws:iam::${ACCOUNT}:role/pcflow-airflow`

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const input = JSON.parse(Buffer.concat(chunks).toString())

const results = []
for (const request of input.requests) {
  const simulation = {
    request: {
      principal: PRINCIPAL,
      action: request.action,
      resource: { resource: request.resource, accountId: ACCOUNT },
      contextVariables: request.context || {},
    },
    identityPolicies: input.policies,
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    permissionBoundaryPolicies: input.boundary ? [{ name: 'boundary', policy: input.boundary }] : undefined,
  }
  const answer = await runSimulation(simulation, {})
  if (answer.resultType === 'error') {
    results.push({ decision: 'error', errors: answer.errors })
  } else {
    const ignored = answer.resultType === 'single' ? answer.result.ignoredContextKeys || [] : []
    results.push({ decision: answer.overallResult, ignored })
  }
}
process.stdout.write(JSON.stringify(results))
